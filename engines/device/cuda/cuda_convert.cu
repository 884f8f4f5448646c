/* cuda_convert.cu — fp32 to bf16 / IEEE half on the GPU, the bf16 operand
 * copies of the gemm, and the plain tiled gemm used where cuBLASLt is not.
 *
 * Rounding is the CPU device's bit arithmetic (cuda_common.cuh), so both
 * devices produce the same bits: bf16 and f16 round to nearest even, NaN
 * stays NaN, overflow becomes inf, f16 subnormals are exact.
 */
#include "cuda_common.cuh"

__global__ void to_bf16_kernel(uint16_t *out, const float *x, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		out[i] = bf16_bits(x[i]);
}

__global__ void to_f16_kernel(uint16_t *out, const float *x, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		out[i] = f16_bits(x[i]);
}

/* dst[r, c] (row stride cols) = bf16(src[r * ld + c]); rows over
 * blockIdx.y (grid-stride), columns over x: no division per element. */
__global__ void round_2d_kernel(uint16_t *dst, const float *src, int64_t rows,
				int64_t cols, int64_t ld)
{
	for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
		for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
		     c += (int64_t)gridDim.x * blockDim.x)
			dst[r * cols + c] = bf16_bits(src[r * ld + c]);
}

extern "C" int cuda_to_bf16(struct device *dev, uint16_t *out, const float *x, int64_t n)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0)
		return -EINVAL;
	if (n == 0)
		return 0;
	to_bf16_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, cuda_stream(dev)>>>(out, x, n);
	return cuda_launched(dev);
}

extern "C" int cuda_to_f16(struct device *dev, uint16_t *out, const float *x, int64_t n)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (n < 0)
		return -EINVAL;
	if (n == 0)
		return 0;
	to_f16_kernel<<<ew_blocks(dev, n), EW_THREADS, 0, cuda_stream(dev)>>>(out, x, n);
	return cuda_launched(dev);
}

extern "C" int cuda_round_bf16_2d(struct device *dev, uint16_t *dst, const float *src,
				  int64_t rows, int64_t cols, int64_t ld)
{
	int64_t n = rows * cols;

	dim3 grid((unsigned int)((cols + EW_THREADS - 1) / EW_THREADS),
		  (unsigned int)(rows < 65535 ? rows : 65535));

	if (n <= 0)
		return 0;
	if (grid.x > 64)
		grid.x = 64;
	round_2d_kernel<<<grid, EW_THREADS, 0, cuda_stream(dev)>>>(dst, src, rows, cols, ld);
	return cuda_launched(dev);
}

/* ---- plain tiled gemm ---- */

#define ST 16   /* tile edge */

/* One ST x ST tile of C per block, threads (x: column, y: row). Each
 * element sums its K products in ascending k, fp32. */
__global__ void gemm_simple_kernel(bool bf16, bool ta, bool tb, int64_t M, int64_t N,
				   int64_t K, const float *A, int64_t lda,
				   const float *B, int64_t ldb, float beta, float *C,
				   int64_t ldc)
{
	__shared__ float as[ST][ST + 1], bs[ST][ST + 1];
	int tx = threadIdx.x, ty = threadIdx.y;
	int64_t i = blockIdx.y * (int64_t)ST + ty, j = blockIdx.x * (int64_t)ST + tx;
	float acc = 0.0f;

	for (int64_t k0 = 0; k0 < K; k0 += ST) {
		/* as[ty][tx] = opA(row i0 + ty, k0 + tx); bs[ty][tx] = opB(k0 + ty, j0 + tx) */
		int64_t ai = blockIdx.y * (int64_t)ST + ty, ak = k0 + tx;
		int64_t bk = k0 + ty, bj = blockIdx.x * (int64_t)ST + tx;
		float a = 0.0f, b = 0.0f;

		if (ai < M && ak < K)
			a = ta ? A[ak * lda + ai] : A[ai * lda + ak];
		if (bk < K && bj < N)
			b = tb ? B[bj * ldb + bk] : B[bk * ldb + bj];
		if (bf16) {
			a = bf16_round(a);
			b = bf16_round(b);
		}
		as[ty][tx] = a;
		bs[ty][tx] = b;
		__syncthreads();
		for (int kk = 0; kk < ST; kk++)
			acc = fmaf(as[ty][kk], bs[kk][tx], acc);
		__syncthreads();
	}
	if (i < M && j < N) {
		float *c = C + i * ldc + j;

		*c = beta == 0.0f ? acc : acc + beta * *c;
	}
}

extern "C" int cuda_gemm_simple(struct device *dev, bool bf16, bool trans_a, bool trans_b,
				int64_t M, int64_t N, int64_t K,
				const float *A, int64_t lda, const float *B, int64_t ldb,
				float beta, float *C, int64_t ldc)
{
	dim3 grid((unsigned int)((N + ST - 1) / ST), (unsigned int)((M + ST - 1) / ST));

	if ((M + ST - 1) / ST > 65535)
		return -EINVAL;
	gemm_simple_kernel<<<grid, dim3(ST, ST), 0, cuda_stream(dev)>>>(
		bf16, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
	return cuda_launched(dev);
}

__global__ void scale_rows_kernel(float *C, int64_t M, int64_t N, int64_t ldc, float beta)
{
	int64_t n = M * N;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / N, c = i - r * N;
		float *p = C + r * ldc + c;

		*p = beta == 0.0f ? 0.0f : *p * beta;
	}
}

extern "C" int cuda_scale_rows(struct device *dev, float *C, int64_t M, int64_t N,
			       int64_t ldc, float beta)
{
	scale_rows_kernel<<<ew_blocks(dev, M * N), EW_THREADS, 0, cuda_stream(dev)>>>(C, M, N,
										    ldc, beta);
	return cuda_launched(dev);
}
