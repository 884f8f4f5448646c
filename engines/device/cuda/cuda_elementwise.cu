/* cuda_elementwise.cu — embedding forward, rotary embedding, SwiGLU, bias
 * add and axpby on the GPU: one thread per output element (grid-stride),
 * the same fp32 formulas as the CPU device (cpu_elementwise.c), so results
 * agree to the last bits up to the libm differences (expf, sincosf: CUDA's
 * are within 2 ulp; no fast-math intrinsics are used).
 *
 * Refinement of device.h: embedding_fwd writes zeros for ids outside
 * [0, V) instead of reading out of bounds (the caller checks ids; the
 * kernel cannot report an error without a synchronization).
 */
#include "cuda_common.cuh"

/* Largest head dimension rope accepts (as the CPU device). */
#define ROPE_MAX_HALF 512

__global__ void embedding_fwd_kernel(float *out, const float *wte, const int32_t *ids,
				     int64_t T, int64_t C, int64_t V)
{
	int64_t n = T * C;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / C, c = i - t * C;
		int32_t id = ids[t];

		out[i] = (id >= 0 && id < V) ? wte[(int64_t)id * C + c] : 0.0f;
	}
}

/* device.h gives embedding_fwd no V: rows are read unchecked there, as on
 * the CPU; V = INT64_MAX disables the guard's upper bound. */
extern "C" int cuda_embedding_fwd(struct device *dev, float *out, const float *wte,
				  const int32_t *ids, int64_t T, int64_t C)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || C < 0)
		return -EINVAL;
	if (T == 0 || C == 0)
		return 0;
	embedding_fwd_kernel<<<ew_blocks(dev, T * C), EW_THREADS, 0, cuda_stream(dev)>>>(
		out, wte, ids, T, C, INT64_MAX);
	return cuda_launched(dev);
}

/* One thread per (t, head, i < D/2): the pair (x[i], x[i + D/2]). The angle
 * is formed in fp32 as Hugging Face does, then cos / sin. */
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq,
			    int64_t T, int64_t NH, int64_t D, bool inverse)
{
	int64_t half = D / 2, n = T * NH * half;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t j = i % half, th = i / half, t = th / NH;
		float ang = (float)pos[t] * inv_freq[j], s, c, a, b;
		float *x1 = x + th * D + j, *x2 = x1 + half;

		sincosf(ang, &s, &c);
		if (inverse)
			s = -s;
		a = *x1;
		b = *x2;
		*x1 = a * c - b * s;
		*x2 = b * c + a * s;
	}
}

extern "C" int cuda_rope(struct device *dev, float *x, const int32_t *pos,
			 const float *inv_freq, int64_t T, int64_t NH, int64_t D,
			 bool inverse)
{
	int64_t n = T * NH * (D / 2);
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || NH < 0 || D < 0 || D % 2 || D / 2 > ROPE_MAX_HALF)
		return -EINVAL;
	if (n == 0)
		return 0;
	rope_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, cuda_stream(dev)>>>(x, pos, inv_freq, T,
									      NH, D, inverse);
	return cuda_launched(dev);
}

__device__ __forceinline__ float sigmoidf_(float g)
{
	return 1.0f / (1.0f + expf(-g));
}

__global__ void swiglu_fwd_kernel(float *out, const float *gate, const float *up, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float g = gate[i];

		out[i] = g * sigmoidf_(g) * up[i];
	}
}

/* d/dg silu(g) = s (1 + g (1 - s)) with s = sigmoid(g). */
__global__ void swiglu_bwd_kernel(float *dgate, float *dup, const float *dout,
				  const float *gate, const float *up, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float g = gate[i], d = dout[i], s = sigmoidf_(g), u = up[i];

		dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
		dup[i] = d * g * s;
	}
}

extern "C" int cuda_swiglu_fwd(struct device *dev, float *out, const float *gate,
			       const float *up, int64_t n)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0)
		return -EINVAL;
	if (n == 0)
		return 0;
	swiglu_fwd_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, cuda_stream(dev)>>>(out, gate, up, n);
	return cuda_launched(dev);
}

extern "C" int cuda_swiglu_bwd(struct device *dev, float *dgate, float *dup,
			       const float *dout, const float *gate, const float *up,
			       int64_t n)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0)
		return -EINVAL;
	if (n == 0)
		return 0;
	swiglu_bwd_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, cuda_stream(dev)>>>(
		dgate, dup, dout, gate, up, n);
	return cuda_launched(dev);
}

__global__ void bias_add_kernel(float *x, const float *bias, int64_t R, int64_t N)
{
	int64_t n = R * N;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		x[i] += bias[i % N];
}

extern "C" int cuda_bias_add(struct device *dev, float *x, const float *bias,
			     int64_t R, int64_t N)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (R < 0 || N < 0)
		return -EINVAL;
	if (R == 0 || N == 0)
		return 0;
	bias_add_kernel<<<ew_blocks(dev, R * N), EW_THREADS, 0, cuda_stream(dev)>>>(x, bias, R, N);
	return cuda_launched(dev);
}

__global__ void axpby_kernel(float *y, float a, const float *x, float b, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		y[i] = b == 0.0f ? a * x[i] : a * x[i] + b * y[i];
}

extern "C" int cuda_axpby(struct device *dev, float *y, float a, const float *x,
			  float b, int64_t n)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0)
		return -EINVAL;
	if (n == 0)
		return 0;
	axpby_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, cuda_stream(dev)>>>(y, a, x, b, n);
	return cuda_launched(dev);
}
