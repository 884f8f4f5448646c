/* cuda_optim.cu — AdamW step, sum of squares and finiteness check on the
 * GPU (semantics and formulas of cpu_optim.c).
 *
 * adamw: torch.optim.AdamW's single-tensor path; scalars such as 1 - beta2
 * and lr / bc1 are formed in double on the host and rounded to fp32 once;
 * per-element arithmetic is fp32 in torch's order (nvcc may contract a
 * multiply and an add into an FMA, as gcc may on the CPU).
 *
 * sumsq: fixed blocks of SUMSQ_BLOCK elements, each summed in double by a
 * fixed tree, then the block sums added in block order by one block: the
 * result depends only on the data. It is copied back to the host, so the
 * call waits for the stream.
 */
#include "cuda_common.cuh"

#define SUMSQ_BLOCK 16384
#define RED_THREADS 256

__global__ void adamw_kernel(float *p, float *grad, float *m, float *v, int64_t n,
			     float grad_scale, float decay, float b1, float omb1, float b2,
			     float omb2, float bc2_sqrt, float neg_step, float eps)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float g = grad[i] * grad_scale;
		float pi = p[i] * decay;
		float mi = m[i] * b1 + omb1 * g;
		float vi = v[i] * b2 + omb2 * g * g;
		float denom = sqrtf(vi) / bc2_sqrt + eps;

		m[i] = mi;
		v[i] = vi;
		p[i] = pi + neg_step * (mi / denom);
		grad[i] = 0.0f;
	}
}

extern "C" int cuda_adamw(struct device *dev, float *p, float *grad, float *m,
			  float *v, int64_t n, double lr, double beta1, double beta2,
			  double eps, double weight_decay, int64_t step, float grad_scale)
{
	double bc1, bc2;
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0 || step < 1)
		return -EINVAL;
	if (n == 0)
		return 0;
	bc1 = 1.0 - pow(beta1, (double)step);
	bc2 = 1.0 - pow(beta2, (double)step);
	adamw_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, cuda_stream(dev)>>>(
		p, grad, m, v, n, grad_scale, (float)(1.0 - lr * weight_decay), (float)beta1,
		(float)(1.0 - beta1), (float)beta2, (float)(1.0 - beta2), (float)sqrt(bc2),
		(float)(-lr / bc1), (float)eps);
	return cuda_launched(dev);
}

/* Sum of a block's RED_THREADS values in double, fixed tree; the result is
 * valid in thread 0. */
__device__ double block_sum_d(double v)
{
	__shared__ double w[RED_THREADS / 32];
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;

	v = warp_sum_d(v);
	if (lane == 0)
		w[wid] = v;
	__syncthreads();
	if (wid == 0) {
		v = lane < RED_THREADS / 32 ? w[lane] : 0.0;
		v = warp_sum_d(v);
	}
	return v;
}

__global__ void sumsq_part_kernel(double *part, const float *x, int64_t n)
{
	int64_t lo = blockIdx.x * (int64_t)SUMSQ_BLOCK;
	int64_t hi = n - lo < SUMSQ_BLOCK ? n : lo + SUMSQ_BLOCK;
	double s = 0.0;

	for (int64_t i = lo + threadIdx.x; i < hi; i += RED_THREADS)
		s += (double)x[i] * (double)x[i];
	s = block_sum_d(s);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double *out, const double *part, int64_t nb)
{
	double s = 0.0;

	for (int64_t i = threadIdx.x; i < nb; i += RED_THREADS)
		s += part[i];
	s = block_sum_d(s);
	if (threadIdx.x == 0)
		*out = s;
}

extern "C" int cuda_sumsq(struct device *dev, double *ret, const float *x, int64_t n)
{
	int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
	cudaStream_t s = cuda_stream(dev);
	double *part, h;
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0 || nb > INT32_MAX)
		return -EINVAL;
	if (n == 0) {
		*ret = 0.0;
		return 0;
	}
	part = (double *)cuda_scratch(dev, CUDA_SCRATCH_REDUCE, (size_t)(nb + 1) * sizeof(double));
	if (!part)
		return -ENOMEM;
	sumsq_part_kernel<<<(unsigned int)nb, RED_THREADS, 0, s>>>(part + 1, x, n);
	r = cuda_launched(dev);
	if (r)
		return r;
	sumsq_final_kernel<<<1, RED_THREADS, 0, s>>>(part, part + 1, nb);
	r = cuda_launched(dev);
	if (!r)
		r = cuda_err(dev, cudaMemcpyAsync(&h, part, sizeof(h), cudaMemcpyDeviceToHost, s));
	if (!r)
		r = cuda_err(dev, cudaStreamSynchronize(s));
	if (!r)
		*ret = h;
	return r;
}

/* flag = 1 when any element is inf or NaN (exponent all ones; an integer
 * test, immune to fast-math folding). Every writer stores the same value,
 * so the result does not depend on order. */
__global__ void finite_kernel(int *flag, const float *x, int64_t n)
{
	bool bad = false;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
	if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0)
		*flag = 1;
}

extern "C" int cuda_all_finite(struct device *dev, bool *ret, const float *x, int64_t n)
{
	cudaStream_t s = cuda_stream(dev);
	int *flag, h = 0;
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0)
		return -EINVAL;
	if (n == 0) {
		*ret = true;
		return 0;
	}
	flag = (int *)cuda_scratch(dev, CUDA_SCRATCH_RESULT, sizeof(int));
	if (!flag)
		return -ENOMEM;
	r = cuda_err(dev, cudaMemsetAsync(flag, 0, sizeof(int), s));
	if (r)
		return r;
	finite_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, s>>>(flag, x, n);
	r = cuda_launched(dev);
	if (!r)
		r = cuda_err(dev, cudaMemcpyAsync(&h, flag, sizeof(h), cudaMemcpyDeviceToHost, s));
	if (!r)
		r = cuda_err(dev, cudaStreamSynchronize(s));
	if (!r)
		*ret = h == 0;
	return r;
}
