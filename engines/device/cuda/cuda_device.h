/* cuda_device.h — internals of the CUDA device shared by its source files.
 *
 * The CUDA device keeps every tensor in device memory (cudaMalloc), queues
 * all kernels and copies on one stream per device, runs matrix products
 * through cuBLASLt (loaded with dlopen at open(), see cuda_gemm.c) and the
 * other kernels as hand-written CUDA kernels (cuda_*.cu). Not part of the
 * engine's public interface: only engines/device/cuda/ and tests/gpu/
 * include this file. It is read by both the C compiler (cuda_device.c,
 * cuda_gemm.c, cuda_kernels.c) and nvcc (the .cu files), so it declares
 * functions only; the device structure lives in cuda_internal.h (C).
 *
 * Threading: a device is used by one thread at a time (the engine thread),
 * except mem_in_use, which any thread may read.
 *
 * Errors: every entry point first returns -EIO when the device has failed
 * (dev->failed set by cuda_err on a sticky CUDA error); kernels return
 * -EINVAL for bad shapes, -ENOMEM when scratch memory cannot be had.
 * Faults inside a kernel surface asynchronously, at the next sync or copy
 * to the host, which then fails the device.
 */
#ifndef ENGINED_CUDA_DEVICE_H
#define ENGINED_CUDA_DEVICE_H

#include <cuda_runtime_api.h>

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device-owned scratch buffers, one per purpose so that a kernel can hold
 * several at once. Content does not survive between kernels; not counted
 * in mem_in_use; released by cuda_trim(). */
enum cuda_scratch_slot {
	CUDA_SCRATCH_GEMM_A = 0,   /* bf16 copy of op(A) */
	CUDA_SCRATCH_GEMM_B,       /* bf16 copy of op(B) (when not cached) */
	CUDA_SCRATCH_ROWS,         /* per-row values: attention D_i */
	CUDA_SCRATCH_REDUCE,       /* partial sums of two-stage reductions */
	CUDA_SCRATCH_SORT,         /* embedding backward: keys, values, CUB temp */
	CUDA_SCRATCH_RESULT,       /* small results copied back to the host */
	CUDA_SCRATCH_GROUPS,       /* a grouped product's pointer arrays */
	CUDA_SCRATCH_COUNT,
};

/* The device's stream: every kernel and copy is queued on it. */
cudaStream_t cuda_stream(struct device *dev);
/* Multiprocessors of the device (grid sizing). */
int cuda_sm_count(struct device *dev);
/* 0 while the device works, -EIO once it has failed. */
int cuda_alive(struct device *dev);
/* Map a CUDA status to 0 / -ENOMEM / -EINVAL / -EIO. A sticky error (the
 * context is unusable: illegal address, ECC, launch failure, ...) marks the
 * device failed: dev->failed names it and every later call fails. */
int cuda_err(struct device *dev, cudaError_t e);
/* Status of the kernel launches since the last check (cudaGetLastError),
 * mapped by cuda_err. Call after every launch. */
int cuda_launched(struct device *dev);
/* Scratch slot of at least `bytes`, 256-byte aligned, grown as needed;
 * valid until the next cuda_scratch() of the same slot, cuda_trim() or
 * close(). NULL when out of device memory. */
void *cuda_scratch(struct device *dev, enum cuda_scratch_slot slot, size_t bytes);
/* Give back the device's own memory (scratch, cached bf16 weights): called
 * when device memory runs out and when the engine frees a large block
 * (offload, dropped activations), so that cudaMemGetInfo shows it back. */
void cuda_trim(struct device *dev);

/* ---- kernel helpers of cuda_convert.cu used by the gemm (cuda_gemm.c) ---- */

/* dst[rows, cols] (compact, uint16 bf16 bits) = round(src[rows, cols]) with
 * src row stride ld; round to nearest even, as the CPU device. */
int cuda_round_bf16_2d(struct device *dev, uint16_t *dst, const float *src,
		       int64_t rows, int64_t cols, int64_t ld);
/* C[M,N] = op(A) op(B) (+ beta C) by a plain tiled kernel, each element
 * summed over k in ascending order; inputs rounded to bf16 when bf16. For
 * shapes cuBLASLt does not take (tiny or unaligned dimensions). */
int cuda_gemm_simple(struct device *dev, bool bf16, bool trans_a, bool trans_b,
		     int64_t M, int64_t N, int64_t K,
		     const float *A, int64_t lda, const float *B, int64_t ldb,
		     float beta, float *C, int64_t ldc);
/* C[M,N] = beta * C (beta = 0: zeros, C may hold NaN): the K == 0 product. */
int cuda_scale_rows(struct device *dev, float *C, int64_t M, int64_t N,
		    int64_t ldc, float beta);

/* ---- the kernel table entries: int cuda_<name>(...) for each entry of
 * device.h's DEVICE_KERNELS (semantics there) ---- */
#define CUDA_KERNEL_DECL(name, params) int cuda_##name params;
DEVICE_KERNELS(CUDA_KERNEL_DECL)
#undef CUDA_KERNEL_DECL

extern const struct kernel_table cuda_kernel_table;

/* For tests/gpu: free and total device memory (cudaMemGetInfo) of the
 * current device; 0 or -EIO. */
int cuda_mem_info(size_t *ret_free, size_t *ret_total);

#ifdef __cplusplus
}
#endif

#endif
