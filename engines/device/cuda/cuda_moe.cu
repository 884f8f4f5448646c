/* cuda_moe.cu — a mixture of experts' routing (one token's: moe_route.h,
 * one thread per token: a row has E terms), and the gather and combine of
 * the rows grouped by expert (one thread per element), on the GPU
 * (semantics: device.h), in the CPU device's orders (cpu_moe.c). The k of
 * a token are at most MOE_MAX_K here (engines refuse more).
 */
#include "cuda_common.cuh"
#include "device/moe_route.h"

#define MOE_MAX_K 64

__global__ void moe_route_fwd_kernel(float *probs, int32_t *idx, float *w, int64_t T,
				     int64_t E, int64_t k, bool norm, bool forced)
{
	for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T;
	     t += (int64_t)gridDim.x * blockDim.x)
		moe_route_row_fwd(probs + t * E, idx + t * k, w + t * k, E, k, norm, forced);
}

__global__ void moe_route_bwd_kernel(float *dz, const float *dw, const float *probs,
				     const int32_t *idx, const float *w, const float *aux,
				     int64_t T, int64_t E, int64_t k, bool norm)
{
	for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T;
	     t += (int64_t)gridDim.x * blockDim.x)
		moe_route_row_bwd(dz + t * E, dw + t * k, probs + t * E, idx + t * k, w + t * k,
				  aux, E, k, norm);
}

__global__ void rows_gather_kernel(float *dst, const float *src, const int32_t *rows,
				   int64_t R, int64_t C)
{
	int64_t n = R * C;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / C;

		dst[i] = src[(int64_t)rows[r] * C + (i - r * C)];
	}
}

/* One thread per output element: its token's k terms in ascending pos. */
__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *pos,
				   const float *w, int64_t T, int64_t k, int64_t C)
{
	int64_t n = T * C;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / C, c = i - t * C, last = -1;
		const int32_t *p = pos + t * k;
		float acc = 0.0f;

		for (int64_t m = 0; m < k; m++) {   /* the next larger pos each time */
			int64_t j = -1;

			for (int64_t q = 0; q < k; q++)
				if (p[q] > last && (j < 0 || p[q] < p[j]))
					j = q;
			last = p[j];
			acc += (w ? w[t * k + j] : 1.0f) * y[(int64_t)p[j] * C + c];
		}
		out[i] = acc;
	}
}

/* One thread per output element: the shared expert's share added. */
__global__ void sigmoid_gate_fwd_kernel(float *out, const float *z, const float *y, int64_t T,
					int64_t C)
{
	int64_t n = T * C;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		out[i] += moe_sigmoid(z[i / C]) * y[i];
}

/* One thread per token: its row of dy and the dot product of dz, in the
 * CPU's order. */
__global__ void sigmoid_gate_bwd_kernel(float *dy, float *dz, const float *dout,
					const float *z, const float *y, int64_t T, int64_t C)
{
	for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T;
	     t += (int64_t)gridDim.x * blockDim.x) {
		float s = moe_sigmoid(z[t]);

		dz[t] = s * (1.0f - s) * moe_scale_dot(dy + t * C, dout + t * C, y + t * C, s, C);
	}
}

/* One thread per (token, choice): a row of dy and the dot product dw. */
__global__ void moe_combine_bwd_kernel(float *dy, float *dw, const float *dout,
				       const float *y, const int32_t *pos, const float *w,
				       int64_t T, int64_t k, int64_t C)
{
	int64_t n = T * k;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / k, r = pos[i];

		dw[i] = moe_scale_dot(dy + r * C, dout + t * C, y + r * C, w[i], C);
	}
}

extern "C" int cuda_moe_route_fwd(struct device *dev, float *probs, int32_t *idx, float *w,
				  int64_t T, int64_t E, int64_t k, bool norm, bool forced)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (!moe_route_shape_ok(T, E, k, MOE_MAX_K))
		return -EINVAL;
	if (T == 0)
		return 0;
	moe_route_fwd_kernel<<<ew_blocks(dev, T), EW_THREADS, 0, cuda_stream(dev)>>>(
		probs, idx, w, T, E, k, norm, forced);
	return cuda_launched(dev);
}

extern "C" int cuda_moe_route_bwd(struct device *dev, float *dz, const float *dw,
				  const float *probs, const int32_t *idx, const float *w,
				  const float *aux, int64_t T, int64_t E, int64_t k, bool norm)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (!moe_route_shape_ok(T, E, k, MOE_MAX_K))
		return -EINVAL;
	if (T == 0)
		return 0;
	moe_route_bwd_kernel<<<ew_blocks(dev, T), EW_THREADS, 0, cuda_stream(dev)>>>(
		dz, dw, probs, idx, w, aux, T, E, k, norm);
	return cuda_launched(dev);
}

extern "C" int cuda_rows_gather(struct device *dev, float *dst, const float *src,
				const int32_t *rows, int64_t R, int64_t C)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (R < 0 || C < 0)
		return -EINVAL;
	if (R == 0 || C == 0)
		return 0;
	rows_gather_kernel<<<ew_blocks(dev, R * C), EW_THREADS, 0, cuda_stream(dev)>>>(
		dst, src, rows, R, C);
	return cuda_launched(dev);
}

extern "C" int cuda_moe_combine(struct device *dev, float *out, const float *y,
				const int32_t *pos, const float *w, int64_t T, int64_t k,
				int64_t C)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || k < 1 || k > MOE_MAX_K || C < 0)
		return -EINVAL;
	if (T == 0 || C == 0)
		return 0;
	moe_combine_kernel<<<ew_blocks(dev, T * C), EW_THREADS, 0, cuda_stream(dev)>>>(
		out, y, pos, w, T, k, C);
	return cuda_launched(dev);
}

extern "C" int cuda_moe_combine_bwd(struct device *dev, float *dy, float *dw,
				    const float *dout, const float *y, const int32_t *pos,
				    const float *w, int64_t T, int64_t k, int64_t C)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || k < 1 || k > MOE_MAX_K || C < 0)
		return -EINVAL;
	if (T == 0)
		return 0;
	moe_combine_bwd_kernel<<<ew_blocks(dev, T * k), EW_THREADS, 0, cuda_stream(dev)>>>(
		dy, dw, dout, y, pos, w, T, k, C);
	return cuda_launched(dev);
}

extern "C" int cuda_sigmoid_gate_fwd(struct device *dev, float *out, const float *z,
				     const float *y, int64_t T, int64_t C)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || C < 0)
		return -EINVAL;
	if (T == 0 || C == 0)
		return 0;
	sigmoid_gate_fwd_kernel<<<ew_blocks(dev, T * C), EW_THREADS, 0, cuda_stream(dev)>>>(
		out, z, y, T, C);
	return cuda_launched(dev);
}

extern "C" int cuda_sigmoid_gate_bwd(struct device *dev, float *dy, float *dz,
				     const float *dout, const float *z, const float *y,
				     int64_t T, int64_t C)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || C < 0)
		return -EINVAL;
	if (T == 0)
		return 0;
	sigmoid_gate_bwd_kernel<<<ew_blocks(dev, T), EW_THREADS, 0, cuda_stream(dev)>>>(
		dy, dz, dout, z, y, T, C);
	return cuda_launched(dev);
}
