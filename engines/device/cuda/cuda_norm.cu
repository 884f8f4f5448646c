/* cuda_norm.cu — RMSNorm forward / backward and the bias gradient on the
 * GPU.
 *
 * Rows: one warp per row; the row sums (x^2, g w x) are fp32 per lane then
 * a fixed xor-shuffle tree. With y = x r w, r = (mean(x^2) + eps)^-1/2:
 *   dx_j = r w_j g_j - (r^3 / C) x_j sum_i g_i w_i x_i
 *
 * Column sums over rows (dw += sum_r g x r, dbias += sum_r dout) are
 * deterministic without atomics, in two stages: stage 1 sums fixed chunks
 * of COL_ROWS rows per column in ascending row order into partials
 * [chunks, N]; stage 2 adds each column's partials in chunk order and
 * accumulates into the output. The chunking depends only on R.
 */
#include "cuda_common.cuh"

#define NORM_WARPS 8          /* rows per block */
#define COL_ROWS 128          /* rows per stage-1 chunk (at least) */
#define COL_THREADS 256

__global__ void rmsnorm_fwd_kernel(float *out, float *rstd, const float *x, const float *w,
				   int64_t R, int64_t C, float eps)
{
	int lane = threadIdx.x & 31;
	int64_t r = blockIdx.x * (int64_t)NORM_WARPS + (threadIdx.x >> 5);
	const float *xr;
	float *o, ss = 0.0f, rs;

	if (r >= R)
		return;
	xr = x + r * C;
	o = out + r * C;
	for (int64_t j = lane; j < C; j += 32)
		ss += xr[j] * xr[j];
	ss = warp_sum(ss);
	rs = 1.0f / sqrtf(ss / (float)C + eps);
	if (lane == 0)
		rstd[r] = rs;
	/* out may alias x: each lane rewrites only the elements it read */
	for (int64_t j = lane; j < C; j += 32)
		o[j] = xr[j] * rs * w[j];
}

__global__ void rmsnorm_bwd_kernel(float *dx, const float *dout, const float *x,
				   const float *w, const float *rstd, int64_t R, int64_t C,
				   float beta_dx)
{
	int lane = threadIdx.x & 31;
	int64_t r = blockIdx.x * (int64_t)NORM_WARPS + (threadIdx.x >> 5);
	const float *g, *xr;
	float *d, rs, dot = 0.0f, coef;

	if (r >= R)
		return;
	g = dout + r * C;
	xr = x + r * C;
	d = dx + r * C;
	rs = rstd[r];
	for (int64_t j = lane; j < C; j += 32)
		dot += g[j] * w[j] * xr[j];
	dot = warp_sum(dot);
	coef = rs * rs * rs * dot / (float)C;
	for (int64_t j = lane; j < C; j += 32) {
		float v = rs * w[j] * g[j] - coef * xr[j];

		d[j] = beta_dx == 0.0f ? v : beta_dx * d[j] + v;
	}
}

/* Stage 1: part[chunk, c] = sum over the chunk's rows of a[r, c] (x[r, c]
 * rstd[r] when x is given), ascending r. */
__global__ void col_partial_kernel(float *part, const float *a, const float *x,
				   const float *rstd, int64_t R, int64_t N, int64_t rows)
{
	int64_t c = blockIdx.x * (int64_t)COL_THREADS + threadIdx.x;
	int64_t r0 = blockIdx.y * rows, r1 = r0 + rows < R ? r0 + rows : R;
	float acc = 0.0f;

	if (c >= N)
		return;
	if (x) {
		for (int64_t r = r0; r < r1; r++)
			acc += a[r * N + c] * x[r * N + c] * rstd[r];
	} else {
		for (int64_t r = r0; r < r1; r++)
			acc += a[r * N + c];
	}
	part[blockIdx.y * N + c] = acc;
}

/* Stage 2: out[c] += sum over chunks of part[k, c], ascending k. */
__global__ void col_final_kernel(float *out, const float *part, int64_t chunks, int64_t N)
{
	int64_t c = blockIdx.x * (int64_t)COL_THREADS + threadIdx.x;
	float s = 0.0f;

	if (c >= N)
		return;
	for (int64_t k = 0; k < chunks; k++)
		s += part[k * N + c];
	out[c] += s;
}

/* out[N] += column sums of a[R, N] (times x rstd when x is given). */
static int col_sums(struct device *dev, float *out, const float *a, const float *x,
		    const float *rstd, int64_t R, int64_t N)
{
	/* at most 65535 chunks (grid.y); rows per chunk depends only on R */
	int64_t rows = (R + 65534) / 65535;
	int64_t chunks;
	unsigned int gx = (unsigned int)((N + COL_THREADS - 1) / COL_THREADS);
	float *part;
	int r;

	if (rows < COL_ROWS)
		rows = COL_ROWS;
	chunks = (R + rows - 1) / rows;
	part = (float *)cuda_scratch(dev, CUDA_SCRATCH_REDUCE,
				     (size_t)(chunks * N) * sizeof(float));
	if (!part)
		return -ENOMEM;
	col_partial_kernel<<<dim3(gx, (unsigned int)chunks), COL_THREADS, 0, cuda_stream(dev)>>>(
		part, a, x, rstd, R, N, rows);
	r = cuda_launched(dev);
	if (r)
		return r;
	col_final_kernel<<<gx, COL_THREADS, 0, cuda_stream(dev)>>>(out, part, chunks, N);
	return cuda_launched(dev);
}

extern "C" int cuda_rmsnorm_fwd(struct device *dev, float *out, float *rstd,
				const float *x, const float *w, int64_t R, int64_t C,
				float eps)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (R < 0 || C <= 0)
		return -EINVAL;
	if (R == 0)
		return 0;
	rmsnorm_fwd_kernel<<<(unsigned int)((R + NORM_WARPS - 1) / NORM_WARPS), 32 * NORM_WARPS,
			     0, cuda_stream(dev)>>>(out, rstd, x, w, R, C, eps);
	return cuda_launched(dev);
}

extern "C" int cuda_rmsnorm_bwd(struct device *dev, float *dx, float *dw,
				const float *dout, const float *x, const float *w,
				const float *rstd, int64_t R, int64_t C, float beta_dx)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (R < 0 || C <= 0)
		return -EINVAL;
	if (R == 0)
		return 0;
	rmsnorm_bwd_kernel<<<(unsigned int)((R + NORM_WARPS - 1) / NORM_WARPS), 32 * NORM_WARPS,
			     0, cuda_stream(dev)>>>(dx, dout, x, w, rstd, R, C, beta_dx);
	r = cuda_launched(dev);
	if (r || !dw)
		return r;
	return col_sums(dev, dw, dout, x, rstd, R, C);
}

extern "C" int cuda_bias_bwd(struct device *dev, float *dbias, const float *dout,
			     int64_t R, int64_t N)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (R < 0 || N < 0)
		return -EINVAL;
	if (R == 0 || N == 0)
		return 0;
	return col_sums(dev, dbias, dout, NULL, NULL, R, N);
}
