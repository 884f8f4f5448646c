/* test_gpu_parity.c — the CUDA engine against the CPU engine from the same
 * weights (the seeded random init is computed on the host, identically for
 * both devices). Exits 77 without a GPU.
 *
 * For two small configs (qwen2 with q/k/v bias and head_dim 64; qwen3 with
 * q/k norm, head_dim 128 and tied embeddings), on one packed batch of
 * sequences of mixed lengths:
 *  - fp32 CUDA vs fp32 CPU: log-probs within 2e-4 absolute, gradient
 *    cosine > 0.99999 per tensor (only summation order differs);
 *  - bf16 CUDA vs fp32 CPU (the criterion): log-probs within 0.05
 *    absolute (mean error < 0.01): bf16 rounds matmul inputs to 8 bits of
 *    mantissa (relative 2^-9), through a few layers of a random model;
 *    gradient cosine > 0.999 per tensor;
 *  - 30 AdamW steps (lr 1e-3) on the same batches with bf16 CUDA and bf16
 *    CPU: every loss within 2% of the CPU's, and the loss falls by > 10%;
 *  - a mixture of experts (mixtral, 8 experts top-2, its auxiliary loss),
 *    fp32: log-probs within 2e-4, gradient cosine > 0.99999 per tensor.
 */
#include "gpu_test.h"

static const int32_t LENS[] = { 37, 128, 5, 300, 90, 1, 64 };
#define NLENS ((int32_t)(sizeof(LENS) / sizeof(LENS[0])))

static void compare_grads(struct engine *a, struct engine *ref, double min_cos,
			  const char *what)
{
	struct engine_param_view va, vr;
	struct eng_error err = {0};
	double worst = 1.0;
	const char *worst_name = "";

	for (int64_t i = 0; i < engine_num_params(ref); i++) {
		float *ga;
		double c;

		if (engine_grad(a, i, &va, &err)) {
			printf("FAIL: engine_grad: %s\n", err.msg);
			exit(1);
		}
		/* the view is valid until the next call on that engine: copy */
		ga = gt_xmalloc((size_t)va.numel * sizeof(float));
		memcpy(ga, va.host_data, (size_t)va.numel * sizeof(float));
		if (engine_grad(ref, i, &vr, &err)) {
			printf("FAIL: engine_grad: %s\n", err.msg);
			exit(1);
		}
		c = gt_cosine(ga, vr.host_data, vr.numel);
		gt_check(c > min_cos, "%s: gradient of %s: cosine %.7f <= %g", what, vr.name, c,
			 min_cos);
		if (c < worst) {
			worst = c;
			worst_name = vr.name;
		}
		free(ga);
	}
	gt_note("%s: worst gradient cosine %.7f (%s)", what, worst, worst_name);
}

static void parity(const char *json, const char *label, int64_t vocab)
{
	struct gt_batch b;
	struct engine *ec = gt_engine(json, "cpu", false, 11, 1e-3, false);
	struct engine *eg = gt_engine(json, gt_dev_name(), false, 11, 1e-3, false);
	struct engine *eg16 = gt_engine(json, gt_dev_name(), true, 11, 1e-3, false);
	float *lc, *lg, *lg16;
	double e32 = 0, e16 = 0, mean16 = 0;
	char what[96];

	gt_make_batch(&b, LENS, NLENS, vocab, 5);
	lc = gt_xmalloc(b.n * 4);
	lg = gt_xmalloc(b.n * 4);
	lg16 = gt_xmalloc(b.n * 4);
	gt_check(gt_param_digest(ec) == gt_param_digest(eg), "%s: initial weights differ", label);
	gt_fb(ec, &b, false, lc);
	gt_fb(eg, &b, false, lg);
	gt_fb(eg16, &b, false, lg16);
	for (int64_t t = 0; t < b.n; t++) {
		e32 = fmax(e32, fabs((double)lg[t] - lc[t]));
		e16 = fmax(e16, fabs((double)lg16[t] - lc[t]));
		mean16 += fabs((double)lg16[t] - lc[t]) / (double)b.n;
	}
	gt_check(e32 < 2e-4, "%s: fp32 log-probs differ by %.3g", label, e32);
	gt_check(e16 < 0.05 && mean16 < 0.01, "%s: bf16 log-probs differ by %.3g (mean %.3g)",
		 label, e16, mean16);
	gt_note("%s: log-prob error fp32 %.3g, bf16 %.3g (mean %.3g)", label, e32, e16, mean16);
	snprintf(what, sizeof(what), "%s fp32", label);
	compare_grads(eg, ec, 0.99999, what);
	snprintf(what, sizeof(what), "%s bf16", label);
	compare_grads(eg16, ec, 0.999, what);
	engine_destroy(ec);
	engine_destroy(eg);
	engine_destroy(eg16);
	free(lc);
	free(lg);
	free(lg16);
	free(b.ids);
}

static void training(const char *json, int64_t vocab)
{
	struct engine *ec = gt_engine(json, "cpu", true, 3, 1e-3, false);
	struct engine *eg = gt_engine(json, gt_dev_name(), true, 3, 1e-3, false);
	double first = 0, last = 0, worst = 0;

	for (int s = 0; s < 30; s++) {
		struct gt_batch b;
		double lc, lg;

		/* four batches in rotation: the model can fit them */
		gt_make_batch(&b, LENS, NLENS, vocab, 100 + s % 4);
		lc = gt_fb(ec, &b, false, NULL);
		lg = gt_fb(eg, &b, false, NULL);
		gt_step(ec);
		gt_step(eg);
		worst = fmax(worst, fabs(lg - lc) / lc);
		if (s < 4)
			first += lg / 4;
		if (s >= 26)
			last += lg / 4;
		if (s % 10 == 0 || s == 29)
			gt_note("step %2d: loss cpu %.5f cuda %.5f", s, lc, lg);
		free(b.ids);
	}
	gt_check(worst < 0.02, "training: losses diverge by %.3g relative", worst);
	gt_check(last < 0.9 * first, "training: loss did not fall (%.4f -> %.4f)", first, last);
	engine_destroy(ec);
	engine_destroy(eg);
}

/* A mixture of experts, fp32 on both devices: the CUDA routing, grouping
 * and combine kernels (cuda_moe.cu) against the CPU's, log-probs within
 * 2e-4, gradient cosine > 0.99999 per tensor (every expert's and router's),
 * the auxiliary loss in both. */
static void experts_parity(const char *json, const char *label, int64_t vocab)
{
	struct gt_batch b;
	struct engine *ec = gt_engine(json, "cpu", false, 11, 1e-3, false);
	struct engine *eg = gt_engine(json, gt_dev_name(), false, 11, 1e-3, false);
	float *lc, *lg;
	double e32 = 0;
	char what[96];

	gt_make_batch(&b, LENS, NLENS, vocab, 6);
	lc = gt_xmalloc(b.n * 4);
	lg = gt_xmalloc(b.n * 4);
	gt_check(gt_param_digest(ec) == gt_param_digest(eg), "%s: initial weights differ", label);
	gt_fb(ec, &b, false, lc);
	gt_fb(eg, &b, false, lg);
	for (int64_t t = 0; t < b.n; t++)
		e32 = fmax(e32, fabs((double)lg[t] - lc[t]));
	gt_check(e32 < 2e-4, "%s: fp32 log-probs differ by %.3g", label, e32);
	gt_note("%s: log-prob error fp32 %.3g", label, e32);
	snprintf(what, sizeof(what), "%s fp32", label);
	compare_grads(eg, ec, 0.99999, what);
	engine_destroy(ec);
	engine_destroy(eg);
	free(lc);
	free(lg);
	free(b.ids);
}

int main(void)
{
	double t0 = gt_now();

	gt_require_gpu("test_gpu_parity");
	parity(GT_QWEN2_SMALL, "qwen2 D=64", 2048);
	parity(GT_QWEN3_SMALL, "qwen3 D=128", 1536);
	experts_parity(GT_MIXTRAL_SMALL, "mixtral 8 experts top-2", 1536);
	training(GT_QWEN2_SMALL, 2048);
	gt_note("%.1f s", gt_now() - t0);
	return gt_finish("test_gpu_parity");
}
