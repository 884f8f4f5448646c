/* cuda_internal.h — the CUDA device structure, for its C files only
 * (cuda_device.c, cuda_gemm.c, cuda_gemm_grouped.c); the .cu files reach it through the
 * functions of cuda_device.h. */
#ifndef ENGINED_CUDA_INTERNAL_H
#define ENGINED_CUDA_INTERNAL_H

#include <stdatomic.h>

#include "cuda_device.h"

struct cuda_scratch {
	void *ptr;
	size_t bytes;
};

/* One device allocation handed out by alloc(), for exact mem_in_use and for
 * dropping cached copies of freed memory. */
struct cuda_alloc {
	void *ptr;
	size_t bytes;
};

struct cuda_gemm_state;

struct cuda_device {
	struct device base;              /* first: what callers see */
	int ordinal;                     /* CUDA device number */
	cudaStream_t stream;
	int sm_count;
	atomic_size_t in_use;            /* bytes handed out by alloc, not yet freed */
	struct cuda_alloc *allocs;       /* [n_allocs] live allocations, unordered */
	size_t n_allocs, cap_allocs;
	struct cuda_scratch scratch[CUDA_SCRATCH_COUNT];
	struct cuda_gemm_state *gemm;    /* cuBLASLt handle, plans, bf16 cache */
	void *blas;                      /* cuBLAS's handle (grouped products); NULL: none */
};

static inline struct cuda_device *cuda_dev(struct device *dev)
{
	return (struct cuda_device *)dev;
}

/* cuda_gemm.c: cuBLASLt (dlopen'ed once per process), plan cache and the
 * cache of bf16 weight copies. */
int cuda_gemm_init(struct cuda_device *cd);
void cuda_gemm_fini(struct cuda_device *cd);
/* Drop the cached bf16 copies of memory in [lo, hi) (it is being freed). */
void cuda_gemm_forget(struct cuda_device *cd, const void *lo, const void *hi);
/* Free every cached bf16 copy (cuda_trim). */
void cuda_gemm_trim(struct cuda_device *cd);

/* lib.so.<the headers' cuBLAS major>, else lib.so, dlopen'ed (NULL:
 * not installed): libcublasLt, libcublas. */
void *cuda_blas_dlopen(const char *lib);

/* cuda_gemm_grouped.c: cuBLAS (dlopen'ed once per process) for grouped
 * products; without it cd->blas stays NULL and groups run one by one. */
void cuda_blas_init(struct cuda_device *cd);
void cuda_blas_fini(struct cuda_device *cd);

#endif
