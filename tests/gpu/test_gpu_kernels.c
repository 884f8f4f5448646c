/* test_gpu_kernels.c — every kernel of the CUDA device against the same
 * kernel of the CPU device on random inputs, plus the device's memory,
 * determinism and error behaviour. Exits 77 without a GPU.
 *
 * Tolerances (error relative to the reference's largest magnitude unless
 * said otherwise), and why:
 *  - gemm fp32: 2e-5 of sum_k |a||b| per element: both accumulate in fp32
 *    in different orders (bound ~ sqrt(K) ulp for random data).
 *  - gemm bf16: the same, since both devices round the inputs to bf16 the
 *    same way (round to nearest even) and bf16 x bf16 products are exact in
 *    fp32: only the accumulation order differs. A rounding mismatch would
 *    show as errors ~4e-3.
 *  - elementwise (rope, swiglu, bias, axpby, norms): 1e-5 (libm ulp
 *    differences: expf, sincosf; FMA contraction).
 *  - attention out/dq/dk/dv: 5e-5; lse: 1e-5 absolute (fp32 online softmax
 *    vs the CPU's exact row max).
 *  - log-prob / entropy: 2e-5 absolute (values of order log V ~ 12, sums
 *    of 152k terms in fp32 per thread, double across threads on both).
 *  - AdamW: 1e-6 relative per element (one FMA of difference at most).
 *  - sumsq: 1e-12 relative (double sums in different fixed orders).
 *  - bf16 / f16 conversion: bit-exact, special values included.
 *  - determinism: embedding_bwd, bias_bwd, rmsnorm_bwd, attention_bwd,
 *    gemm, sumsq give the same bits twice.
 */
#include "gpu_test.h"

#include "device/cuda/cuda_device.h"

static struct device *cpu, *gpu, *cpu16, *gpu16;

/* Upload the same host data to both devices. */
struct pair {
	void *c, *g;
	size_t bytes;
};

static struct pair pair_up(const void *host, size_t bytes)
{
	struct pair p = { gt_up(cpu, host, bytes), gt_up(gpu, host, bytes), bytes };

	return p;
}

static void pair_free(struct pair *p)
{
	cpu->ops->free(cpu, p->c);
	gpu->ops->free(gpu, p->g);
}

/* Download both sides into fresh host buffers. */
static void pair_down(const struct pair *p, float **c, float **g)
{
	*c = gt_down(cpu, p->c, p->bytes);
	*g = gt_down(gpu, p->g, p->bytes);
}

static float *rnd(int64_t n, float lo, float hi)
{
	float *x = gt_xmalloc((size_t)n * sizeof(float));

	gt_fill(x, n, lo, hi);
	return x;
}

/* ---- gemm ---- */

static void test_gemm_case(struct device *dc, struct device *dg, bool ta, bool tb,
			   int64_t M, int64_t N, int64_t K, int64_t pad, float beta)
{
	int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
	int64_t a_rows = ta ? K : M, b_rows = tb ? N : K;
	float *A = rnd(a_rows * lda, -1, 1), *B = rnd(b_rows * ldb, -1, 1);
	float *C = rnd(M * ldc, -1, 1), *bound = gt_xmalloc((size_t)(M * N) * sizeof(float));
	float *rc, *rg;
	void *Ac = gt_up(dc, A, a_rows * lda * 4), *Bc = gt_up(dc, B, b_rows * ldb * 4);
	void *Ag = gt_up(dg, A, a_rows * lda * 4), *Bg = gt_up(dg, B, b_rows * ldb * 4);
	void *Cc, *Cg;
	double worst = 0;
	int r1, r2;

	if (beta == 0.0f)
		for (int64_t i = 0; i < M * ldc; i++)
			C[i] = NAN;   /* beta = 0 must not read C */
	Cc = gt_up(dc, C, M * ldc * 4);
	Cg = gt_up(dg, C, M * ldc * 4);
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double s = 0;

			for (int64_t k = 0; k < K; k++)
				s += fabs(ta ? A[k * lda + i] : A[i * lda + k]) *
				     fabs(tb ? B[j * ldb + k] : B[k * ldb + j]);
			bound[i * N + j] = (float)(s + (beta ? fabs(C[i * ldc + j]) : 0) + 1e-30);
		}
	r1 = dc->k->gemm(dc, ta, tb, M, N, K, Ac, lda, Bc, ldb, beta, Cc, ldc);
	r2 = dg->k->gemm(dg, ta, tb, M, N, K, Ag, lda, Bg, ldb, beta, Cg, ldc);
	gt_check(r1 == 0 && r2 == 0, "gemm rc cpu %d cuda %d", r1, r2);
	rc = gt_down(dc, Cc, M * ldc * 4);
	rg = gt_down(dg, Cg, M * ldc * 4);
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double e = fabs((double)rc[i * ldc + j] - rg[i * ldc + j]) / bound[i * N + j];

			if (!(e <= worst))
				worst = e != e ? INFINITY : e;
		}
	gt_check(worst <= 2e-5, "gemm %s ta=%d tb=%d M=%lld N=%lld K=%lld pad=%lld beta=%g: "
		 "err %.3g of sum|a||b|", dg->prec == MATMUL_BF16 ? "bf16" : "fp32", ta, tb,
		 (long long)M, (long long)N, (long long)K, (long long)pad, beta, worst);
	if (pad) {
		/* the padding columns of C are untouched */
		bool same = true;

		for (int64_t i = 0; i < M; i++)
			for (int64_t j = N; j < ldc; j++)
				same &= memcmp(&rg[i * ldc + j], &C[i * ldc + j], 4) == 0;
		gt_check(same, "gemm wrote C's padding columns");
	}
	free(A);
	free(B);
	free(C);
	free(bound);
	free(rc);
	free(rg);
	dc->ops->free(dc, Ac);
	dc->ops->free(dc, Bc);
	dc->ops->free(dc, Cc);
	dg->ops->free(dg, Ag);
	dg->ops->free(dg, Bg);
	dg->ops->free(dg, Cg);
}

static void test_gemm(void)
{
	static const int64_t shapes[][3] = {
		{ 64, 96, 128 }, { 257, 129, 300 }, { 5, 7, 3 }, { 1, 896, 64 }, { 512, 1, 96 },
		{ 33, 40, 1 }, { 300, 4864 / 8, 896 / 4 },
	};

	for (int prec = 0; prec < 2; prec++) {
		struct device *dc = prec ? cpu16 : cpu, *dg = prec ? gpu16 : gpu;

		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
			for (int t = 0; t < 4; t++)
				test_gemm_case(dc, dg, t & 1, t >> 1, shapes[s][0], shapes[s][1],
					       shapes[s][2], s == 1 ? 3 : 0, (s + t) % 2 ? 1.0f : 0.0f);
	}
}

/* The bf16 copy of a B operand in the parameter region is reused while
 * param_version is unchanged and made again after a bump. */
static void test_gemm_weight_cache(void)
{
	const int64_t M = 64, N = 128, K = 96;
	float *A = rnd(M * K, -1, 1), *W1 = rnd(N * K, -1, 1), *W2 = rnd(N * K, -1, 1);
	float *Cref1 = NULL, *Cref2 = NULL, *c;
	void *Ag = gt_up(gpu16, A, M * K * 4), *Wg = gt_up(gpu16, W1, N * K * 4);
	void *Cg = gt_up(gpu16, NULL, M * N * 4);
	void *Wc = gt_up(cpu16, W1, N * K * 4), *Ac = gt_up(cpu16, A, M * K * 4);
	void *Cc = gt_up(cpu16, NULL, M * N * 4);

	/* references on the CPU: x W1^T and x W2^T */
	cpu16->k->gemm(cpu16, false, true, M, N, K, Ac, K, Wc, K, 0.0f, Cc, N);
	Cref1 = gt_down(cpu16, Cc, M * N * 4);
	cpu16->ops->copy_h2d(cpu16, Wc, W2, N * K * 4);
	cpu16->k->gemm(cpu16, false, true, M, N, K, Ac, K, Wc, K, 0.0f, Cc, N);
	Cref2 = gt_down(cpu16, Cc, M * N * 4);

	gpu16->param_base = Wg;
	gpu16->param_bytes = N * K * 4;
	gpu16->param_version++;
	gt_check(gpu16->k->gemm(gpu16, false, true, M, N, K, Ag, K, Wg, K, 0.0f, Cg, N) == 0,
		 "cached gemm rc");
	c = gt_down(gpu16, Cg, M * N * 4);
	gt_check(gt_rel_err(c, Cref1, M * N, 1e-6) < 1e-5, "weight cache: first product");
	free(c);
	/* change the weights without telling the device: the cached copy is
	 * still used (this is the contract: the engine bumps the version) */
	gpu16->ops->copy_h2d(gpu16, Wg, W2, N * K * 4);
	gpu16->k->gemm(gpu16, false, true, M, N, K, Ag, K, Wg, K, 0.0f, Cg, N);
	c = gt_down(gpu16, Cg, M * N * 4);
	gt_check(gt_dry_run() || gt_rel_err(c, Cref1, M * N, 1e-6) < 1e-5,
		 "weight cache: the copy was not reused before the version bump");
	free(c);
	gpu16->param_version++;
	gpu16->k->gemm(gpu16, false, true, M, N, K, Ag, K, Wg, K, 0.0f, Cg, N);
	c = gt_down(gpu16, Cg, M * N * 4);
	gt_check(gt_rel_err(c, Cref2, M * N, 1e-6) < 1e-5,
		 "weight cache: not refreshed after param_version changed");
	free(c);
	gpu16->param_base = NULL;
	gpu16->param_bytes = 0;
	gpu16->ops->free(gpu16, Ag);
	gpu16->ops->free(gpu16, Wg);
	gpu16->ops->free(gpu16, Cg);
	cpu16->ops->free(cpu16, Ac);
	cpu16->ops->free(cpu16, Wc);
	cpu16->ops->free(cpu16, Cc);
	free(A);
	free(W1);
	free(W2);
	free(Cref1);
	free(Cref2);
}

/* The experts' grouped product (cuBLAS's grouped GEMM in fp32, the groups
 * one by one in bf16): 16 groups of uneven rows (some empty) as one
 * projection, against the CPU's group-by-group products, and the same
 * bits twice. */
static void test_gemm_grouped(struct device *dc, struct device *dg)
{
	const int64_t G = 16, I = 96, Cw = 128;
	int64_t rows[16], R = 0;
	struct gemm_group gc[16], gg[16];
	float *x, *w, *c, *g, *again;
	void *xc, *xg, *wc, *wg, *yc, *yg;

	for (int64_t e = 0; e < G; e++) {
		rows[e] = e % 5 == 3 ? 0 : 1 + (e * 37) % 61;
		R += rows[e];
	}
	x = rnd(R * Cw, -1, 1);
	w = rnd(G * I * Cw, -1, 1);
	xc = gt_up(dc, x, R * Cw * 4);
	xg = gt_up(dg, x, R * Cw * 4);
	wc = gt_up(dc, w, G * I * Cw * 4);
	wg = gt_up(dg, w, G * I * Cw * 4);
	yc = gt_up(dc, NULL, R * I * 4);
	yg = gt_up(dg, NULL, R * I * 4);
	for (int64_t e = 0, r0 = 0; e < G; r0 += rows[e], e++) {
		gc[e] = (struct gemm_group){.M = rows[e], .N = I, .K = Cw,
					    .A = (float *)xc + r0 * Cw,
					    .B = (float *)wc + e * I * Cw, .C = (float *)yc + r0 * I};
		gg[e] = (struct gemm_group){.M = rows[e], .N = I, .K = Cw,
					    .A = (float *)xg + r0 * Cw,
					    .B = (float *)wg + e * I * Cw, .C = (float *)yg + r0 * I};
	}
	gt_check(dc->k->gemm_grouped(dc, false, true, G, gc, Cw, Cw, 0.0f, I) == 0 &&
		 dg->k->gemm_grouped(dg, false, true, G, gg, Cw, Cw, 0.0f, I) == 0,
		 "gemm_grouped rc");
	c = gt_down(dc, yc, R * I * 4);
	g = gt_down(dg, yg, R * I * 4);
	gt_check(gt_rel_err(g, c, R * I, 1e-6) < 2e-5, "gemm_grouped %s err %.3g",
		 dg->prec == MATMUL_BF16 ? "bf16" : "fp32", gt_rel_err(g, c, R * I, 1e-6));
	dg->k->gemm_grouped(dg, false, true, G, gg, Cw, Cw, 0.0f, I);
	again = gt_down(dg, yg, R * I * 4);
	gt_check(memcmp(again, g, R * I * 4) == 0, "gemm_grouped not deterministic");
	dc->ops->free(dc, xc);
	dc->ops->free(dc, wc);
	dc->ops->free(dc, yc);
	dg->ops->free(dg, xg);
	dg->ops->free(dg, wg);
	dg->ops->free(dg, yg);
	free(x);
	free(w);
	free(c);
	free(g);
	free(again);
}

/* ---- embedding, norms, elementwise ---- */

static void test_embedding(void)
{
	const int64_t T = 3000, C = 200, V = 517;
	int32_t *ids = gt_xmalloc(T * 4);
	float *wte = rnd(V * C, -1, 1), *dout = rnd(T * C, -1, 1), *dw0 = rnd(V * C, -1, 1);
	struct pair pi, pw, po, pd, pdw;
	float *a, *b, *again;

	for (int64_t t = 0; t < T; t++)   /* skewed: id 7 is frequent */
		ids[t] = (int32_t)(t % 3 == 0 ? 7 : gt_u64() % V);
	pi = pair_up(ids, T * 4);
	pw = pair_up(wte, V * C * 4);
	po = pair_up(NULL, T * C * 4);
	pd = pair_up(dout, T * C * 4);
	pdw = pair_up(dw0, V * C * 4);
	gt_check(cpu->k->embedding_fwd(cpu, po.c, pw.c, pi.c, T, C) == 0 &&
		 gpu->k->embedding_fwd(gpu, po.g, pw.g, pi.g, T, C) == 0, "embedding_fwd rc");
	pair_down(&po, &a, &b);
	gt_check(memcmp(a, b, T * C * 4) == 0, "embedding_fwd differs");
	free(a);
	free(b);
	gt_check(cpu->k->embedding_bwd(cpu, pdw.c, pd.c, pi.c, T, C, V, 1) == 0 &&
		 gpu->k->embedding_bwd(gpu, pdw.g, pd.g, pi.g, T, C, V, 1) == 0, "embedding_bwd rc");
	pair_down(&pdw, &a, &b);
	gt_check(gt_rel_err(b, a, V * C, 1e-6) < 1e-5, "embedding_bwd err %.3g",
		 gt_rel_err(b, a, V * C, 1e-6));
	/* deterministic: the same inputs again give the same bits */
	gpu->ops->copy_h2d(gpu, pdw.g, dw0, V * C * 4);
	gpu->k->embedding_bwd(gpu, pdw.g, pd.g, pi.g, T, C, V, 1);
	again = gt_down(gpu, pdw.g, V * C * 4);
	gt_check(memcmp(again, b, V * C * 4) == 0, "embedding_bwd not deterministic");
	free(a);
	free(b);
	free(again);
	pair_free(&pi);
	pair_free(&pw);
	pair_free(&po);
	pair_free(&pd);
	pair_free(&pdw);
	free(ids);
	free(wte);
	free(dout);
	free(dw0);
}

static void test_rmsnorm(int64_t R, int64_t C)
{
	float *x = rnd(R * C, -2, 2), *w = rnd(C, 0.5, 1.5), *g = rnd(R * C, -1, 1);
	float *dx0 = rnd(R * C, -1, 1), *dw0 = rnd(C, -1, 1);
	struct pair px = pair_up(x, R * C * 4), pw = pair_up(w, C * 4), po = pair_up(NULL, R * C * 4);
	struct pair pr = pair_up(NULL, R * 4), pg = pair_up(g, R * C * 4);
	struct pair pdx = pair_up(dx0, R * C * 4), pdw = pair_up(dw0, C * 4);
	float *a, *b, *again;

	gt_check(cpu->k->rmsnorm_fwd(cpu, po.c, pr.c, px.c, pw.c, R, C, 1e-6f) == 0 &&
		 gpu->k->rmsnorm_fwd(gpu, po.g, pr.g, px.g, pw.g, R, C, 1e-6f) == 0, "rmsnorm_fwd rc");
	pair_down(&po, &a, &b);
	gt_check(gt_rel_err(b, a, R * C, 0) < 1e-5, "rmsnorm_fwd R=%lld C=%lld err %.3g",
		 (long long)R, (long long)C, gt_rel_err(b, a, R * C, 0));
	free(a);
	free(b);
	pair_down(&pr, &a, &b);
	gt_check(gt_rel_err(b, a, R, 0) < 1e-5, "rmsnorm rstd err");
	free(a);
	free(b);
	for (int beta = 0; beta < 2; beta++) {
		cpu->ops->copy_h2d(cpu, pdx.c, dx0, R * C * 4);
		gpu->ops->copy_h2d(gpu, pdx.g, dx0, R * C * 4);
		gt_check(cpu->k->rmsnorm_bwd(cpu, pdx.c, pdw.c, pg.c, px.c, pw.c, pr.c, R, C,
					     (float)beta) == 0 &&
			 gpu->k->rmsnorm_bwd(gpu, pdx.g, pdw.g, pg.g, px.g, pw.g, pr.g, R, C,
					     (float)beta) == 0, "rmsnorm_bwd rc");
		pair_down(&pdx, &a, &b);
		gt_check(gt_rel_err(b, a, R * C, 0) < 1e-5, "rmsnorm_bwd dx beta=%d err %.3g", beta,
			 gt_rel_err(b, a, R * C, 0));
		free(a);
		free(b);
	}
	pair_down(&pdw, &a, &b);
	gt_check(gt_rel_err(b, a, C, 0) < 1e-5, "rmsnorm_bwd dw err %.3g", gt_rel_err(b, a, C, 0));
	/* dw accumulates in a fixed order */
	gpu->ops->copy_h2d(gpu, pdw.g, dw0, C * 4);
	gpu->k->rmsnorm_bwd(gpu, pdx.g, pdw.g, pg.g, px.g, pw.g, pr.g, R, C, 0.0f);
	gpu->k->rmsnorm_bwd(gpu, pdx.g, pdw.g, pg.g, px.g, pw.g, pr.g, R, C, 0.0f);
	again = gt_down(gpu, pdw.g, C * 4);
	gt_check(memcmp(again, b, C * 4) == 0, "rmsnorm_bwd dw not deterministic");
	free(again);
	free(a);
	free(b);
	pair_free(&px);
	pair_free(&pw);
	pair_free(&po);
	pair_free(&pr);
	pair_free(&pg);
	pair_free(&pdx);
	pair_free(&pdw);
	free(x);
	free(w);
	free(g);
	free(dx0);
	free(dw0);
}

static void test_rope(void)
{
	const int64_t T = 700, NH = 6, D = 64;
	float *x = rnd(T * NH * D, -1, 1), *inv = gt_xmalloc(D / 2 * 4), *a, *b;
	int32_t *pos = gt_xmalloc(T * 4);
	struct pair px, pp, pi;

	for (int64_t i = 0; i < D / 2; i++)
		inv[i] = (float)pow(1e6, -2.0 * i / D);
	for (int64_t t = 0; t < T; t++)
		pos[t] = (int32_t)(t < 300 ? t : 4000 + t);   /* large angles too */
	px = pair_up(x, T * NH * D * 4);
	pp = pair_up(pos, T * 4);
	pi = pair_up(inv, D / 2 * 4);
	for (int inverse = 0; inverse < 2; inverse++) {
		gt_check(cpu->k->rope(cpu, px.c, pp.c, pi.c, T, NH, D, inverse) == 0 &&
			 gpu->k->rope(gpu, px.g, pp.g, pi.g, T, NH, D, inverse) == 0, "rope rc");
		pair_down(&px, &a, &b);
		gt_check(gt_rel_err(b, a, T * NH * D, 0) < 1e-5, "rope inverse=%d err %.3g", inverse,
			 gt_rel_err(b, a, T * NH * D, 0));
		free(a);
		free(b);
	}
	pair_free(&px);
	pair_free(&pp);
	pair_free(&pi);
	free(x);
	free(inv);
	free(pos);
}

static void test_elementwise(void)
{
	const int64_t R = 333, N = 1000, n = R * N;
	float *g = rnd(n, -6, 6), *u = rnd(n, -2, 2), *d = rnd(n, -1, 1), *bias = rnd(N, -1, 1);
	float *db0 = rnd(N, -1, 1), *a, *b;
	struct pair pg = pair_up(g, n * 4), pu = pair_up(u, n * 4), pd = pair_up(d, n * 4);
	struct pair po = pair_up(NULL, n * 4), po2 = pair_up(NULL, n * 4);
	struct pair pb = pair_up(bias, N * 4), pdb = pair_up(db0, N * 4);

	cpu->k->swiglu_fwd(cpu, po.c, pg.c, pu.c, n);
	gpu->k->swiglu_fwd(gpu, po.g, pg.g, pu.g, n);
	pair_down(&po, &a, &b);
	gt_check(gt_rel_err(b, a, n, 0) < 1e-5, "swiglu_fwd err %.3g", gt_rel_err(b, a, n, 0));
	free(a);
	free(b);
	cpu->k->swiglu_bwd(cpu, po.c, po2.c, pd.c, pg.c, pu.c, n);
	gpu->k->swiglu_bwd(gpu, po.g, po2.g, pd.g, pg.g, pu.g, n);
	pair_down(&po, &a, &b);
	gt_check(gt_rel_err(b, a, n, 0) < 1e-5, "swiglu_bwd dgate err %.3g", gt_rel_err(b, a, n, 0));
	free(a);
	free(b);
	pair_down(&po2, &a, &b);
	gt_check(gt_rel_err(b, a, n, 0) < 1e-5, "swiglu_bwd dup err %.3g", gt_rel_err(b, a, n, 0));
	free(a);
	free(b);

	cpu->ops->copy_h2d(cpu, po.c, g, n * 4);
	gpu->ops->copy_h2d(gpu, po.g, g, n * 4);
	cpu->k->bias_add(cpu, po.c, pb.c, R, N);
	gpu->k->bias_add(gpu, po.g, pb.g, R, N);
	pair_down(&po, &a, &b);
	gt_check(memcmp(a, b, n * 4) == 0, "bias_add differs");
	free(a);
	free(b);
	cpu->k->bias_bwd(cpu, pdb.c, pd.c, R, N);
	gpu->k->bias_bwd(gpu, pdb.g, pd.g, R, N);
	pair_down(&pdb, &a, &b);
	gt_check(gt_rel_err(b, a, N, 1e-3) < 1e-5, "bias_bwd err %.3g", gt_rel_err(b, a, N, 1e-3));
	free(a);
	free(b);

	for (int k = 0; k < 2; k++) {
		float beta = k ? 0.5f : 0.0f;

		cpu->ops->copy_h2d(cpu, po.c, u, n * 4);
		gpu->ops->copy_h2d(gpu, po.g, u, n * 4);
		cpu->k->axpby(cpu, po.c, -1.5f, pd.c, beta, n);
		gpu->k->axpby(gpu, po.g, -1.5f, pd.g, beta, n);
		pair_down(&po, &a, &b);
		gt_check(gt_rel_err(b, a, n, 0) < 1e-6, "axpby b=%g err", beta);
		free(a);
		free(b);
	}
	pair_free(&pg);
	pair_free(&pu);
	pair_free(&pd);
	pair_free(&po);
	pair_free(&po2);
	pair_free(&pb);
	pair_free(&pdb);
	free(g);
	free(u);
	free(d);
	free(bias);
	free(db0);
}

/* ---- attention ---- */

/* gd: the CUDA device under test (fp32: the fp32 kernels; bf16: the
 * tensor-core kernels for D in {64, 128}); tol: relative error allowed on
 * out, dq, dk, dv; tol_lse: absolute on lse. */
static void test_attention_on(struct device *gd, const int32_t *lens, int nseq, int64_t H,
			      int64_t KV, int64_t D, double tol, double tol_lse)
{
	int32_t cu[65];
	int64_t T = 0;
	float scale = 1.0f / sqrtf((float)D);
	float *q, *k, *v, *dout, *a, *b, *again;
	struct pair pq, pk, pv, po, pl, pdo, pdq, pdk, pdv, pcu;
	bool det = true;

	cu[0] = 0;
	for (int s = 0; s < nseq; s++) {
		T += lens[s];
		cu[s + 1] = (int32_t)T;
	}
	q = rnd(T * H * D, -2, 2);
	k = rnd(T * KV * D, -2, 2);
	v = rnd(T * KV * D, -1, 1);
	dout = rnd(T * H * D, -1, 1);
	pq = pair_up(q, T * H * D * 4);
	pk = pair_up(k, T * KV * D * 4);
	pv = pair_up(v, T * KV * D * 4);
	po = pair_up(NULL, T * H * D * 4);
	pl = pair_up(NULL, H * T * 4);
	pdo = pair_up(dout, T * H * D * 4);
	pdq = pair_up(NULL, T * H * D * 4);
	pdk = pair_up(NULL, T * KV * D * 4);
	pdv = pair_up(NULL, T * KV * D * 4);
	pcu = pair_up(cu, (nseq + 1) * 4);
	gt_check(cpu->k->attention_fwd(cpu, po.c, pl.c, pq.c, pk.c, pv.c, pcu.c, nseq, T, H, KV, D,
				       scale) == 0, "cpu attention_fwd");
	gt_check(gd->k->attention_fwd(gd, po.g, pl.g, pq.g, pk.g, pv.g, pcu.g, nseq, T, H, KV, D,
				       scale) == 0 && gd->ops->sync(gd) == 0, "cuda attention_fwd rc");
	pair_down(&po, &a, &b);
	gt_check(gt_rel_err(b, a, T * H * D, 0) < tol, "attention %s out T=%lld H=%lld KV=%lld "
		 "D=%lld err %.3g", gd->prec ? "bf16" : "fp32", (long long)T, (long long)H,
		 (long long)KV, (long long)D, gt_rel_err(b, a, T * H * D, 0));
	free(a);
	free(b);
	pair_down(&pl, &a, &b);
	gt_check(gt_max_abs_err(b, a, H * T) < tol_lse, "attention lse D=%lld err %.3g",
		 (long long)D, gt_max_abs_err(b, a, H * T));
	free(a);
	free(b);
	/* the backward runs on each device's own forward results */
	gt_check(cpu->k->attention_bwd(cpu, pdq.c, pdk.c, pdv.c, pdo.c, pq.c, pk.c, pv.c, po.c,
				       pl.c, pcu.c, nseq, T, H, KV, D, scale) == 0, "cpu attention_bwd");
	gt_check(gd->k->attention_bwd(gd, pdq.g, pdk.g, pdv.g, pdo.g, pq.g, pk.g, pv.g, po.g,
				       pl.g, pcu.g, nseq, T, H, KV, D, scale) == 0 &&
		 gd->ops->sync(gd) == 0, "cuda attention_bwd rc");
	{
		struct pair *outs[3] = { &pdq, &pdk, &pdv };
		const char *names[3] = { "dq", "dk", "dv" };
		int64_t sizes[3] = { T * H * D, T * KV * D, T * KV * D };

		for (int i = 0; i < 3; i++) {
			pair_down(outs[i], &a, &b);
			gt_check(gt_rel_err(b, a, sizes[i], 0) < tol, "attention %s %s D=%lld err %.3g",
				 gd->prec ? "bf16" : "fp32", names[i], (long long)D,
				 gt_rel_err(b, a, sizes[i], 0));
			if (i == 1) {
				gd->k->attention_bwd(gd, pdq.g, pdk.g, pdv.g, pdo.g, pq.g, pk.g, pv.g,
						      po.g, pl.g, pcu.g, nseq, T, H, KV, D, scale);
				gd->ops->sync(gd);
				again = gt_down(gpu, pdk.g, sizes[1] * 4);
				det = memcmp(again, b, sizes[1] * 4) == 0;
				free(again);
			}
			free(a);
			free(b);
		}
	}
	gt_check(det, "attention_bwd not deterministic");
	pair_free(&pq);
	pair_free(&pk);
	pair_free(&pv);
	pair_free(&po);
	pair_free(&pl);
	pair_free(&pdo);
	pair_free(&pdq);
	pair_free(&pdk);
	pair_free(&pdv);
	pair_free(&pcu);
	free(q);
	free(k);
	free(v);
	free(dout);
}

static void test_attention(const int32_t *lens, int nseq, int64_t H, int64_t KV, int64_t D)
{
	test_attention_on(gpu, lens, nseq, H, KV, D, 5e-5, 1e-5);
}

/* The bf16 tensor-core kernels against the fp32 CPU reference: inputs and
 * probabilities rounded to bf16 (relative 2^-9) through two products;
 * scores of |s| <~ 8 give lse errors ~ 8 * 2^-8. */
static void test_attention_bf16(const int32_t *lens, int nseq, int64_t H, int64_t KV, int64_t D)
{
	test_attention_on(gpu16, lens, nseq, H, KV, D, 3e-2, 5e-2);
}

static void test_attentions(void)
{
	static const int32_t mixed[] = { 1, 7, 64, 65, 130, 300, 2, 33 };
	static const int32_t one[] = { 1000 };

	test_attention(mixed, 8, 8, 2, 64);
	test_attention(mixed, 8, 4, 4, 128);
	test_attention(mixed, 8, 6, 2, 32);
	test_attention(one, 1, 2, 1, 128);
	test_attention(mixed, 8, 2, 1, 256);
	test_attention(mixed, 8, 4, 2, 80);
	test_attention_bf16(mixed, 8, 8, 2, 64);
	test_attention_bf16(mixed, 8, 4, 2, 128);
	test_attention_bf16(one, 1, 2, 1, 128);
}

/* ---- the paged key/value cache ---- */

/* kv_write into blocks of 16 taken in reverse order, then attention_paged
 * of every token over its cached positions, on both devices. The cache
 * contents must be bit-identical (copies); the outputs within the fp32
 * attention tolerance. */
static void test_paged(const int32_t *lens, int nseq, int64_t H, int64_t KV, int64_t D)
{
	const int64_t B16 = 16;
	int64_t T = 0, nblocks = 0, ntab = 0, t = 0;
	float scale = 1.0f / sqrtf((float)D), *q, *k, *v, *a, *b;
	int32_t *tables, *toff, *slots, *pos;
	struct pair pq, pk, pv, pkc, pvc, po, ptab, ptoff, pslots, ppos;

	for (int s = 0; s < nseq; s++) {
		T += lens[s];
		nblocks += (lens[s] + B16 - 1) / B16;
	}
	tables = gt_xmalloc((size_t)nblocks * 4);
	toff = gt_xmalloc((size_t)T * 4);
	slots = gt_xmalloc((size_t)T * 4);
	pos = gt_xmalloc((size_t)T * 4);
	for (int64_t i = 0; i < nblocks; i++)
		tables[i] = (int32_t)(nblocks - 1 - i);
	for (int s = 0; s < nseq; s++) {
		for (int32_t j = 0; j < lens[s]; j++, t++) {
			toff[t] = (int32_t)ntab;
			pos[t] = j;
			slots[t] = tables[ntab + j / B16] * (int32_t)B16 + j % B16;
		}
		ntab += (lens[s] + B16 - 1) / B16;
	}
	q = rnd(T * H * D, -2, 2);
	k = rnd(T * KV * D, -2, 2);
	v = rnd(T * KV * D, -1, 1);
	pq = pair_up(q, T * H * D * 4);
	pk = pair_up(k, T * KV * D * 4);
	pv = pair_up(v, T * KV * D * 4);
	pkc = pair_up(NULL, nblocks * B16 * KV * D * 4);
	pvc = pair_up(NULL, nblocks * B16 * KV * D * 4);
	po = pair_up(NULL, T * H * D * 4);
	ptab = pair_up(tables, nblocks * 4);
	ptoff = pair_up(toff, T * 4);
	pslots = pair_up(slots, T * 4);
	ppos = pair_up(pos, T * 4);
	gt_check(cpu->k->kv_write(cpu, pkc.c, pvc.c, pk.c, pv.c, pslots.c, T, KV, D) == 0 &&
		 cpu->k->attention_paged(cpu, po.c, pq.c, pkc.c, pvc.c, ptab.c, ptoff.c, ppos.c,
					 T, H, KV, D, B16, scale) == 0, "cpu paged");
	gt_check(gpu->k->kv_write(gpu, pkc.g, pvc.g, pk.g, pv.g, pslots.g, T, KV, D) == 0 &&
		 gpu->k->attention_paged(gpu, po.g, pq.g, pkc.g, pvc.g, ptab.g, ptoff.g, ppos.g,
					 T, H, KV, D, B16, scale) == 0 && gpu->ops->sync(gpu) == 0,
		 "cuda paged rc");
	pair_down(&pkc, &a, &b);
	gt_check(memcmp(a, b, pkc.bytes) == 0, "kv_write: caches differ");
	free(a);
	free(b);
	pair_down(&po, &a, &b);
	gt_check(gt_rel_err(b, a, T * H * D, 0) < 5e-5, "attention_paged T=%lld H=%lld KV=%lld "
		 "D=%lld err %.3g", (long long)T, (long long)H, (long long)KV, (long long)D,
		 gt_rel_err(b, a, T * H * D, 0));
	free(a);
	free(b);
	pair_free(&pq);
	pair_free(&pk);
	pair_free(&pv);
	pair_free(&pkc);
	pair_free(&pvc);
	pair_free(&po);
	pair_free(&ptab);
	pair_free(&ptoff);
	pair_free(&pslots);
	pair_free(&ppos);
	free(q);
	free(k);
	free(v);
	free(tables);
	free(toff);
	free(slots);
	free(pos);
}

static void test_pageds(void)
{
	static const int32_t mixed[] = { 1, 7, 16, 17, 130, 1100, 2, 33 };

	test_paged(mixed, 8, 8, 2, 64);
	test_paged(mixed, 8, 4, 4, 128);
	test_paged(mixed, 8, 14, 2, 64);
}

/* ---- log-prob ---- */

static void test_logprob(int64_t R, int64_t V, float inv_temp)
{
	float *l = rnd(R * V, -8, 8), *dl = rnd(R, -1, 1), *de = rnd(R, -1, 1), *a, *b;
	int32_t *tg = gt_xmalloc(R * 4);
	struct pair pl, pt, plp, pe, pdl, pde;

	for (int64_t r = 0; r < R; r++) {
		tg[r] = r % 5 == 4 ? -1 : (int32_t)(gt_u64() % V);
		if (r % 7 == 3)
			l[r * V + (r % V)] = 30.0f;   /* a dominant logit */
	}
	pl = pair_up(l, R * V * 4);
	pt = pair_up(tg, R * 4);
	plp = pair_up(NULL, R * 4);
	pe = pair_up(NULL, R * 4);
	pdl = pair_up(dl, R * 4);
	pde = pair_up(de, R * 4);
	gt_check(cpu->k->logprob_fwd(cpu, plp.c, pe.c, pl.c, pt.c, R, V, inv_temp) == 0 &&
		 gpu->k->logprob_fwd(gpu, plp.g, pe.g, pl.g, pt.g, R, V, inv_temp) == 0,
		 "logprob_fwd rc");
	pair_down(&plp, &a, &b);
	gt_check(gt_max_abs_err(b, a, R) < 2e-5, "logprob V=%lld logp err %.3g", (long long)V,
		 gt_max_abs_err(b, a, R));
	free(a);
	free(b);
	pair_down(&pe, &a, &b);
	gt_check(gt_max_abs_err(b, a, R) < 2e-5, "logprob V=%lld entropy err %.3g", (long long)V,
		 gt_max_abs_err(b, a, R));
	free(a);
	free(b);
	gt_check(cpu->k->logprob_bwd(cpu, pl.c, pt.c, pdl.c, pde.c, R, V, inv_temp) == 0 &&
		 gpu->k->logprob_bwd(gpu, pl.g, pt.g, pdl.g, pde.g, R, V, inv_temp) == 0,
		 "logprob_bwd rc");
	pair_down(&pl, &a, &b);
	gt_check(gt_rel_err(b, a, R * V, 0) < 2e-5, "logprob_bwd V=%lld err %.3g", (long long)V,
		 gt_rel_err(b, a, R * V, 0));
	free(a);
	free(b);
	pair_free(&pl);
	pair_free(&pt);
	pair_free(&plp);
	pair_free(&pe);
	pair_free(&pdl);
	pair_free(&pde);
	free(l);
	free(dl);
	free(de);
	free(tg);
}

/* The LM head's vocabulary-chunk path: chunk_fwd over the chunks of each
 * row, finish, then chunk_bwd per chunk; against the CPU device. */
static void test_logprob_chunks(int64_t R, int64_t V, int64_t cols, float inv_temp)
{
	float *l = rnd(R * V, -8, 8), *dl = rnd(R, -1, 1), *de = rnd(R, -1, 1);
	float *chunk = gt_xmalloc((size_t)(R * cols) * 4), *a, *b;
	int32_t *tg = gt_xmalloc(R * 4);
	struct pair pst, pt, plg, plp, pe, pls, pez, pdl, pde;
	double worst = 0;

	for (int64_t r = 0; r < R; r++)
		tg[r] = r % 5 == 4 ? -1 : (int32_t)(gt_u64() % V);
	pst = pair_up(NULL, R * sizeof(struct logprob_stats));
	pt = pair_up(tg, R * 4);
	plg = pair_up(NULL, R * cols * 4);
	plp = pair_up(NULL, R * 4);
	pe = pair_up(NULL, R * 4);
	pls = pair_up(NULL, R * 4);
	pez = pair_up(NULL, R * 4);
	pdl = pair_up(dl, R * 4);
	pde = pair_up(de, R * 4);
	for (int pass = 0; pass < 2; pass++) {
		for (int64_t v0 = 0; v0 < V; v0 += cols) {
			int64_t Vc = V - v0 < cols ? V - v0 : cols;
			int r1, r2;

			for (int64_t r = 0; r < R; r++)
				memcpy(chunk + r * Vc, l + r * V + v0, (size_t)Vc * 4);
			cpu->ops->copy_h2d(cpu, plg.c, chunk, R * Vc * 4);
			gpu->ops->copy_h2d(gpu, plg.g, chunk, R * Vc * 4);
			if (pass == 0) {
				r1 = cpu->k->logprob_chunk_fwd(cpu, pst.c, plg.c, pt.c, R, v0, Vc,
							       inv_temp, v0 == 0);
				r2 = gpu->k->logprob_chunk_fwd(gpu, pst.g, plg.g, pt.g, R, v0, Vc,
							       inv_temp, v0 == 0);
				gt_check(r1 == 0 && r2 == 0, "logprob_chunk_fwd rc");
				continue;
			}
			r1 = cpu->k->logprob_chunk_bwd(cpu, plg.c, pt.c, pls.c, pez.c, pdl.c, pde.c, R,
						       v0, Vc, inv_temp);
			r2 = gpu->k->logprob_chunk_bwd(gpu, plg.g, pt.g, pls.g, pez.g, pdl.g, pde.g, R,
						       v0, Vc, inv_temp);
			gt_check(r1 == 0 && r2 == 0, "logprob_chunk_bwd rc");
			a = gt_down(cpu, plg.c, R * Vc * 4);
			b = gt_down(gpu, plg.g, R * Vc * 4);
			worst = fmax(worst, gt_rel_err(b, a, R * Vc, 1e-6));
			free(a);
			free(b);
		}
		if (pass == 0) {
			struct pair *outs[4] = { &plp, &pe, &pls, &pez };
			const char *names[4] = { "logp", "entropy", "lse", "ez" };

			gt_check(cpu->k->logprob_chunk_finish(cpu, plp.c, pe.c, pls.c, pez.c, pst.c,
							      pt.c, R) == 0 &&
				 gpu->k->logprob_chunk_finish(gpu, plp.g, pe.g, pls.g, pez.g, pst.g,
							      pt.g, R) == 0, "logprob_chunk_finish rc");
			for (int i = 0; i < 4; i++) {
				pair_down(outs[i], &a, &b);
				gt_check(gt_max_abs_err(b, a, R) < 2e-5, "logprob chunks V=%lld cols=%lld "
					 "%s err %.3g", (long long)V, (long long)cols, names[i],
					 gt_max_abs_err(b, a, R));
				free(a);
				free(b);
			}
		}
	}
	gt_check(worst < 2e-5, "logprob_chunk_bwd V=%lld cols=%lld err %.3g", (long long)V,
		 (long long)cols, worst);
	pair_free(&pst);
	pair_free(&pt);
	pair_free(&plg);
	pair_free(&plp);
	pair_free(&pe);
	pair_free(&pls);
	pair_free(&pez);
	pair_free(&pdl);
	pair_free(&pde);
	free(l);
	free(dl);
	free(de);
	free(chunk);
	free(tg);
}

/* ---- optimizer, reductions, conversions ---- */

static void test_optim(void)
{
	const int64_t n = 1000003;
	float *p = rnd(n, -1, 1), *g = rnd(n, -1e-2, 1e-2), *m = rnd(n, -1e-3, 1e-3);
	float *v = rnd(n, 0, 1e-5), *a, *b;
	struct pair pp = pair_up(p, n * 4), pg = pair_up(g, n * 4), pm = pair_up(m, n * 4);
	struct pair pv = pair_up(v, n * 4);
	double sc = 0, sg = 0, sg2 = 0;
	bool fc = false, fg = false;

	gt_check(cpu->k->adamw(cpu, pp.c, pg.c, pm.c, pv.c, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3,
			       0.7f) == 0 &&
		 gpu->k->adamw(gpu, pp.g, pg.g, pm.g, pv.g, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3,
			       0.7f) == 0, "adamw rc");
	pair_down(&pp, &a, &b);
	gt_check(gt_rel_err(b, a, n, 0) < 1e-6, "adamw p err %.3g", gt_rel_err(b, a, n, 0));
	free(a);
	free(b);
	pair_down(&pm, &a, &b);
	gt_check(gt_rel_err(b, a, n, 0) < 1e-6, "adamw m err");
	free(a);
	free(b);
	pair_down(&pv, &a, &b);
	gt_check(gt_rel_err(b, a, n, 0) < 1e-6, "adamw v err");
	free(a);
	free(b);
	/* Both consumed the gradients (zero_grad fused); put them back for
	 * the reductions below. */
	pair_down(&pg, &a, &b);
	{
		int64_t left = 0;

		for (int64_t i = 0; i < n; i++)
			left += a[i] != 0.0f || b[i] != 0.0f;
		gt_check(left == 0, "adamw left %lld gradients non-zero", (long long)left);
	}
	free(a);
	free(b);
	memcpy(pg.c, g, n * 4);
	gpu->ops->copy_h2d(gpu, pg.g, g, n * 4);

	cpu->k->sumsq(cpu, &sc, pg.c, n);
	gt_check(gpu->k->sumsq(gpu, &sg, pg.g, n) == 0 && gpu->k->sumsq(gpu, &sg2, pg.g, n) == 0,
		 "sumsq rc");
	gt_check(fabs(sg - sc) <= 1e-12 * sc, "sumsq %.17g vs %.17g", sg, sc);
	gt_check(memcmp(&sg, &sg2, sizeof(sg)) == 0, "sumsq not deterministic");

	gt_check(gpu->k->all_finite(gpu, &fg, pg.g, n) == 0 && fg, "all_finite on finite data");
	g[n / 2] = INFINITY;
	gpu->ops->copy_h2d(gpu, pg.g, g, n * 4);
	gpu->k->all_finite(gpu, &fg, pg.g, n);
	cpu->ops->copy_h2d(cpu, pg.c, g, n * 4);
	cpu->k->all_finite(cpu, &fc, pg.c, n);
	gt_check(!fg && !fc, "all_finite misses inf");
	g[n / 2] = 0;
	g[n - 1] = NAN;
	gpu->ops->copy_h2d(gpu, pg.g, g, n * 4);
	gpu->k->all_finite(gpu, &fg, pg.g, n);
	gt_check(!fg, "all_finite misses NaN");
	pair_free(&pp);
	pair_free(&pg);
	pair_free(&pm);
	pair_free(&pv);
	free(p);
	free(g);
	free(m);
	free(v);
}

static void test_convert(void)
{
	const int64_t n = 1 << 20;
	float *x = rnd(n, -70000, 70000);
	static const uint32_t special[] = {
		0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x80000001u,
		0x33800000u, 0x33000000u, 0x38800000u, 0x387fe000u, 0x477fe000u, 0x477ff000u,
		0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00000000u, 0x80000000u,
	};
	uint16_t *a, *b;
	struct pair px, po;

	for (int64_t i = 0; i < n; i += 3)   /* small magnitudes and subnormals too */
		x[i] = ldexpf(x[i], -(int)(gt_u64() % 40));
	for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
		memcpy(&x[i], &special[i], 4);
	px = pair_up(x, n * 4);
	po = pair_up(NULL, n * 2);
	for (int f16 = 0; f16 < 2; f16++) {
		int r1 = f16 ? cpu->k->to_f16(cpu, po.c, px.c, n) : cpu->k->to_bf16(cpu, po.c, px.c, n);
		int r2 = f16 ? gpu->k->to_f16(gpu, po.g, px.g, n) : gpu->k->to_bf16(gpu, po.g, px.g, n);

		gt_check(r1 == 0 && r2 == 0, "convert rc");
		a = gt_down(cpu, po.c, n * 2);
		b = gt_down(gpu, po.g, n * 2);
		gt_check(memcmp(a, b, n * 2) == 0, "%s conversion differs from the CPU device",
			 f16 ? "f16" : "bf16");
		free(a);
		free(b);
	}
	pair_free(&px);
	pair_free(&po);
	free(x);
}

/* ---- memory and errors ---- */

static void test_memory(void)
{
	size_t base = gpu->ops->mem_in_use(gpu), fr0, fr1, tot;
	void *p = gpu->ops->alloc(gpu, 12345), *q = gpu->ops->alloc(gpu, 1 << 20), *h;

	gt_check(p && q, "alloc");
	gt_check(gpu->ops->mem_in_use(gpu) == base + 12345 + (1 << 20), "mem_in_use after alloc");
	gpu->ops->free(gpu, p);
	gt_check(gpu->ops->mem_in_use(gpu) == base + (1 << 20), "mem_in_use after free");
	gpu->ops->free(gpu, q);
	gpu->ops->free(gpu, NULL);
	gt_check(gpu->ops->mem_in_use(gpu) == base, "mem_in_use back to base");

	/* out of memory: NULL, the device stays usable and not failed */
	p = gpu->ops->alloc(gpu, (size_t)1 << 50);
	gt_check(p == NULL, "alloc of 1 PiB returned memory");
	gt_check(gpu->failed == NULL, "OOM failed the device (%s)", gpu->failed);
	q = gpu->ops->alloc(gpu, 4096);
	gt_check(q != NULL && gpu->ops->memset0(gpu, q, 4096) == 0 && gpu->ops->sync(gpu) == 0,
		 "device unusable after OOM");
	gpu->ops->free(gpu, q);

	/* pinned host memory round trip */
	h = gpu->ops->host_alloc(gpu, 1 << 20);
	gt_check(h != NULL, "host_alloc");
	if (h) {
		float *x = h, *y;

		q = gpu->ops->alloc(gpu, 1 << 20);
		for (int i = 0; i < (1 << 18); i++)
			x[i] = (float)i;
		gpu->ops->copy_h2d(gpu, q, x, 1 << 20);
		y = gt_down(gpu, q, 1 << 20);
		gt_check(memcmp(x, y, 1 << 20) == 0, "pinned round trip");
		free(y);
		gpu->ops->free(gpu, q);
		gpu->ops->host_free(gpu, h);
	}

	/* bad shapes are refused before any launch */
	gt_check(gpu->k->attention_fwd(gpu, NULL, NULL, NULL, NULL, NULL, NULL, 1, 4, 3, 2, 64,
				       1.0f) == -EINVAL, "attention H %% KV accepted");
	gt_check(gpu->k->gemm(gpu, false, false, 4, 4, 4, NULL, 2, NULL, 4, 0.0f, NULL, 4) ==
		 -EINVAL, "gemm lda < K accepted");
	gt_check(gpu->failed == NULL, "device failed after rejected calls");

	/* memory really goes back: a 1 GiB block shows in cudaMemGetInfo */
	if (gt_dry_run())
		return;
	gt_check(cuda_mem_info(&fr0, &tot) == 0, "cuda_mem_info");
	p = gpu->ops->alloc(gpu, (size_t)1 << 30);
	cuda_mem_info(&fr1, &tot);
	gt_check(p && fr0 - fr1 >= ((size_t)1 << 30), "1 GiB alloc not visible in cudaMemGetInfo");
	gpu->ops->free(gpu, p);
	cuda_mem_info(&fr1, &tot);
	gt_check(fr1 + (64u << 20) >= fr0, "1 GiB not given back: free %zu MiB -> %zu MiB",
		 fr0 >> 20, fr1 >> 20);
}

int main(void)
{
	double t0 = gt_now();

	gt_require_gpu("test_gpu_kernels");
	cpu = gt_open("cpu", MATMUL_FP32);
	gpu = gt_open(gt_dev_name(), MATMUL_FP32);
	cpu16 = gt_open("cpu", MATMUL_BF16);
	gpu16 = gt_open(gt_dev_name(), MATMUL_BF16);
	gt_seed(42);
	test_gemm();
	test_gemm_weight_cache();
	test_gemm_grouped(cpu, gpu);
	test_gemm_grouped(cpu16, gpu16);
	test_embedding();
	test_rmsnorm(1000, 896);
	test_rmsnorm(4096, 64);
	test_rmsnorm(3, 8193);
	test_rope();
	test_elementwise();
	test_attentions();
	test_pageds();
	test_logprob(37, 151936, 1.0f);
	test_logprob(200, 50, 1.0f / 0.7f);
	test_logprob_chunks(37, 151936, 2048, 1.0f);
	test_logprob_chunks(300, 1000, 96, 1.0f / 0.7f);
	test_optim();
	test_convert();
	test_memory();
	gt_check(gpu->failed == NULL && gpu16->failed == NULL, "a device failed: %s",
		 gpu->failed ? gpu->failed : gpu16->failed ? gpu16->failed : "");
	gt_note("%.1f s", gt_now() - t0);
	cpu->ops->close(cpu);
	gpu->ops->close(gpu);
	cpu16->ops->close(cpu16);
	gpu16->ops->close(gpu16);
	return gt_finish("test_gpu_kernels");
}
