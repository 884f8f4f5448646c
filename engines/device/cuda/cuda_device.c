/* cuda_device.c — the CUDA device: open/close, memory, copies, scratch and
 * the failure state.
 *
 * Memory: alloc is cudaMalloc (256-byte aligned); a failed cudaMalloc first
 * gives back the device's own memory (cuda_trim) and tries once more, then
 * returns NULL, so the engine reports -ENOMEM and stays usable. mem_in_use
 * is exact: every live allocation is recorded with its size. host_alloc is
 * cudaHostAlloc (page-locked: offload copies run at full PCIe speed).
 *
 * Ordering: everything is queued on the device's one stream. copy_h2d and
 * copy_d2h return when the copy is complete (the engine reuses its host
 * buffers at once and reads results right after the call); copy_d2d and
 * memset0 are asynchronous like kernels. free and host_free wait for the
 * stream first, since queued work may still read the memory.
 *
 * Failure: a sticky CUDA error (cuda_err) sets dev->failed; from then on
 * every call returns -EIO (alloc NULL) without touching the GPU, except
 * free/close, which still release what they can.
 *
 * The device ordinal is ENGINED_CUDA_DEVICE (default 0); one daemon per GPU
 * normally sets CUDA_VISIBLE_DEVICES instead and keeps 0.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "cuda_internal.h"

/* Freeing a block at least this large means the engine is shrinking its
 * footprint (offload, dropped activations): the device's own memory goes
 * back too. Training steps never free blocks this large. */
#define CUDA_TRIM_BYTES ((size_t)64 << 20)

#define CUDA_ALIGN 256

cudaStream_t cuda_stream(struct device *dev)
{
	return cuda_dev(dev)->stream;
}

int cuda_sm_count(struct device *dev)
{
	return cuda_dev(dev)->sm_count;
}

int cuda_alive(struct device *dev)
{
	struct cuda_device *cd = cuda_dev(dev);

	if (dev->failed)
		return -EIO;
	/* The current device (and context) is per host thread, and the
	 * engine may run on a thread other than the one that opened the
	 * device; cuBLASLt calls need the context current. Cheap when it
	 * already is. */
	if (cudaSetDevice(cd->ordinal) != cudaSuccess)
		return cuda_err(dev, cudaGetLastError());
	return 0;
}

/* Errors after which the context is unusable (the CUDA documentation's
 * "sticky" errors: the process must be restarted). */
static bool sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorLaunchTimeout:
	case cudaErrorECCUncorrectable:
	case cudaErrorAssert:
	case cudaErrorNvlinkUncorrectable:
	case cudaErrorContextIsDestroyed:
	case cudaErrorDevicesUnavailable:
	case cudaErrorCudartUnloading:
	case cudaErrorUnknown:
		return true;
	default:
		return false;
	}
}

int cuda_err(struct device *dev, cudaError_t e)
{
	cudaError_t probe;

	if (e == cudaSuccess)
		return 0;
	if (dev->failed)
		return -EIO;
	/* Clear a non-sticky error so that it is not reported again. */
	(void)cudaGetLastError();
	if (e == cudaErrorMemoryAllocation)
		return -ENOMEM;
	if (!sticky(e)) {
		/* An error we do not list may still have broken the context:
		 * a query of the stream reports a sticky error again. */
		probe = cudaStreamQuery(cuda_dev(dev)->stream);
		if (probe == cudaSuccess || probe == cudaErrorNotReady) {
			switch (e) {
			case cudaErrorInvalidValue:
			case cudaErrorInvalidConfiguration:
			case cudaErrorInvalidDevicePointer:
			case cudaErrorInvalidMemcpyDirection:
			case cudaErrorInvalidPitchValue:
			case cudaErrorInvalidResourceHandle:
			case cudaErrorInvalidDeviceFunction:
				return -EINVAL;
			default:
				return -EIO;
			}
		}
		e = probe;
	}
	dev->failed = cudaGetErrorName(e);
	return -EIO;
}

int cuda_launched(struct device *dev)
{
	return cuda_err(dev, cudaGetLastError());
}

int cuda_mem_info(size_t *ret_free, size_t *ret_total)
{
	size_t f, t;

	if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
		(void)cudaGetLastError();
		return -EIO;
	}
	*ret_free = f;
	*ret_total = t;
	return 0;
}

static void scratch_release(struct cuda_device *cd)
{
	for (int i = 0; i < CUDA_SCRATCH_COUNT; i++) {
		if (cd->scratch[i].ptr)
			(void)cudaFree(cd->scratch[i].ptr);
		cd->scratch[i].ptr = NULL;
		cd->scratch[i].bytes = 0;
	}
}

void cuda_trim(struct device *dev)
{
	struct cuda_device *cd = cuda_dev(dev);

	/* queued kernels may still use scratch */
	(void)cudaStreamSynchronize(cd->stream);
	scratch_release(cd);
	cuda_gemm_trim(cd);
	(void)cudaGetLastError();
}

void *cuda_scratch(struct device *dev, enum cuda_scratch_slot slot, size_t bytes)
{
	struct cuda_device *cd = cuda_dev(dev);
	struct cuda_scratch *s = &cd->scratch[slot];
	size_t rounded;
	void *p = NULL;

	if (s->ptr && s->bytes >= bytes)
		return s->ptr;
	/* The old buffer may be in use by queued work. */
	if (s->ptr) {
		(void)cudaStreamSynchronize(cd->stream);
		(void)cudaFree(s->ptr);
	}
	s->ptr = NULL;
	s->bytes = 0;
	/* Grow by at least 1/4 so that slowly increasing sizes do not
	 * reallocate on every call. */
	rounded = bytes + bytes / 4;
	rounded = (rounded + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN;
	if (rounded < CUDA_ALIGN)
		rounded = CUDA_ALIGN;
	if (cudaMalloc(&p, rounded) != cudaSuccess) {
		(void)cudaGetLastError();
		/* a big slot may be worth more than the cached weights,
		 * which queued products may still read */
		(void)cudaStreamSynchronize(cd->stream);
		cuda_gemm_trim(cd);
		if (cudaMalloc(&p, rounded) != cudaSuccess) {
			(void)cudaGetLastError();
			return NULL;
		}
	}
	s->ptr = p;
	s->bytes = rounded;
	return p;
}

static void cuda_close(struct device *dev)
{
	struct cuda_device *cd;

	if (!dev)
		return;
	cd = cuda_dev(dev);
	if (cd->stream)
		(void)cudaStreamSynchronize(cd->stream);
	cuda_blas_fini(cd);
	cuda_gemm_fini(cd);
	scratch_release(cd);
	/* Allocations the caller did not free die with the device. */
	for (size_t i = 0; i < cd->n_allocs; i++)
		(void)cudaFree(cd->allocs[i].ptr);
	free(cd->allocs);
	if (cd->stream)
		(void)cudaStreamDestroy(cd->stream);
	(void)cudaGetLastError();
	free(cd);
}

static int cuda_open(struct device **ret, int threads, enum matmul_precision prec)
{
	struct cuda_device *cd;
	const char *env = getenv("ENGINED_CUDA_DEVICE");
	int count = 0, ordinal = 0, r;

	if (prec != MATMUL_FP32 && prec != MATMUL_BF16)
		return -EINVAL;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
		(void)cudaGetLastError();
		return -ENODEV;
	}
	if (env && *env) {
		char *end;
		long v = strtol(env, &end, 10);

		if (*end || v < 0 || v >= count)
			return -ENODEV;
		ordinal = (int)v;
	}
	if (cudaSetDevice(ordinal) != cudaSuccess) {
		(void)cudaGetLastError();
		return -ENODEV;
	}
	cd = calloc(1, sizeof(*cd));
	if (!cd)
		return -ENOMEM;
	cd->base.ops = &cuda_device_ops;
	cd->base.k = &cuda_kernel_table;
	cd->base.prec = prec;
	cd->base.matmul = prec == MATMUL_BF16 ?
			  "bf16 operands, fp32 accumulation (cuBLASLt)" :
			  "fp32 (cuBLASLt, CUBLAS_COMPUTE_32F)";
	cd->base.host_memory = false;
	cd->ordinal = ordinal;
	atomic_init(&cd->in_use, 0);
	if (cudaDeviceGetAttribute(&cd->sm_count, cudaDevAttrMultiProcessorCount,
				   ordinal) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&cd->stream, cudaStreamNonBlocking) != cudaSuccess) {
		(void)cudaGetLastError();
		cuda_close(&cd->base);
		return -ENODEV;
	}
	r = cuda_gemm_init(cd);
	if (r < 0) {
		cuda_close(&cd->base);
		return r;
	}
	cuda_blas_init(cd);
	*ret = &cd->base;
	return 0;
}

static int record_alloc(struct cuda_device *cd, void *p, size_t bytes)
{
	if (cd->n_allocs == cd->cap_allocs) {
		size_t cap = cd->cap_allocs ? 2 * cd->cap_allocs : 64;
		struct cuda_alloc *a = realloc(cd->allocs, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		cd->allocs = a;
		cd->cap_allocs = cap;
	}
	cd->allocs[cd->n_allocs].ptr = p;
	cd->allocs[cd->n_allocs].bytes = bytes;
	cd->n_allocs++;
	return 0;
}

static void *cuda_alloc(struct device *dev, size_t bytes)
{
	struct cuda_device *cd = cuda_dev(dev);
	cudaError_t e;
	void *p = NULL;

	if (cuda_alive(dev) || device_alloc_fault())
		return NULL;
	e = cudaMalloc(&p, bytes ? bytes : 1);
	if (e == cudaErrorMemoryAllocation) {
		(void)cudaGetLastError();
		cuda_trim(dev);
		e = cudaMalloc(&p, bytes ? bytes : 1);
	}
	if (e != cudaSuccess) {
		(void)cuda_err(dev, e);
		return NULL;
	}
	if (record_alloc(cd, p, bytes)) {
		(void)cudaFree(p);
		return NULL;
	}
	atomic_fetch_add(&cd->in_use, bytes);
	return p;
}

static void cuda_free(struct device *dev, void *ptr)
{
	struct cuda_device *cd = cuda_dev(dev);
	size_t i, bytes;

	if (!ptr)
		return;
	for (i = 0; i < cd->n_allocs; i++)
		if (cd->allocs[i].ptr == ptr)
			break;
	if (i == cd->n_allocs)
		return;   /* not ours: ignore rather than corrupt the heap */
	bytes = cd->allocs[i].bytes;
	cd->allocs[i] = cd->allocs[--cd->n_allocs];
	atomic_fetch_sub(&cd->in_use, bytes);
	/* Queued kernels may still read or write the block. */
	(void)cudaStreamSynchronize(cd->stream);
	cuda_gemm_forget(cd, ptr, (const char *)ptr + bytes);
	(void)cudaFree(ptr);
	(void)cudaGetLastError();
	if (bytes >= CUDA_TRIM_BYTES && !dev->failed)
		cuda_trim(dev);
}

static int cuda_memset0(struct device *dev, void *ptr, size_t bytes)
{
	int r = cuda_alive(dev);

	if (r || !bytes)
		return r;
	return cuda_err(dev, cudaMemsetAsync(ptr, 0, bytes, cuda_dev(dev)->stream));
}

static int copy_wait(struct device *dev, void *dst, const void *src, size_t bytes,
		     enum cudaMemcpyKind kind)
{
	cudaStream_t s = cuda_dev(dev)->stream;
	int r = cuda_alive(dev);

	if (r || !bytes)
		return r;
	r = cuda_err(dev, cudaMemcpyAsync(dst, src, bytes, kind, s));
	if (!r)
		r = cuda_err(dev, cudaStreamSynchronize(s));
	return r;
}

static int cuda_copy_h2d(struct device *dev, void *dst, const void *src, size_t bytes)
{
	return copy_wait(dev, dst, src, bytes, cudaMemcpyHostToDevice);
}

static int cuda_copy_d2h(struct device *dev, void *dst, const void *src, size_t bytes)
{
	return copy_wait(dev, dst, src, bytes, cudaMemcpyDeviceToHost);
}

/* Asynchronous; the ranges must not overlap. */
static int cuda_copy_d2d(struct device *dev, void *dst, const void *src, size_t bytes)
{
	int r = cuda_alive(dev);

	if (r || !bytes)
		return r;
	return cuda_err(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
					     cuda_dev(dev)->stream));
}

static int cuda_sync(struct device *dev)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	return cuda_err(dev, cudaStreamSynchronize(cuda_dev(dev)->stream));
}

/* Marks are CUDA events without timing (the cheapest kind). */
static void *cuda_mark_new(struct device *dev)
{
	cudaEvent_t ev;

	if (cuda_alive(dev) || cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) !=
	    cudaSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	return ev;
}

static int cuda_mark_set(struct device *dev, void *mark)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	return cuda_err(dev, cudaEventRecord((cudaEvent_t)mark, cuda_dev(dev)->stream));
}

static void cuda_mark_free(struct device *dev, void *mark)
{
	(void)dev;
	if (!mark)
		return;
	(void)cudaEventDestroy((cudaEvent_t)mark);
	(void)cudaGetLastError();
}

static size_t cuda_mem_in_use(struct device *dev)
{
	return atomic_load(&cuda_dev(dev)->in_use);
}

static size_t cuda_mem_free(struct device *dev)
{
	size_t f, t;

	(void)dev;
	return cuda_mem_info(&f, &t) == 0 ? f : SIZE_MAX;
}

/* Host memory is not counted in mem_in_use: it is what "offloaded" means. */
static void *cuda_host_alloc(struct device *dev, size_t bytes)
{
	void *p = NULL;

	if (cuda_alive(dev) || device_alloc_fault())
		return NULL;
	if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	return p;
}

static void cuda_host_free(struct device *dev, void *ptr)
{
	if (!ptr)
		return;
	/* A queued copy may still read or write it. */
	(void)cudaStreamSynchronize(cuda_dev(dev)->stream);
	(void)cudaFreeHost(ptr);
	(void)cudaGetLastError();
}

const struct device_ops cuda_device_ops = {
	.name = "cuda",
	.open = cuda_open,
	.close = cuda_close,
	.alloc = cuda_alloc,
	.free = cuda_free,
	.memset0 = cuda_memset0,
	.copy_h2d = cuda_copy_h2d,
	.copy_d2h = cuda_copy_d2h,
	.copy_d2d = cuda_copy_d2d,
	.sync = cuda_sync,
	.mark_new = cuda_mark_new,
	.mark_set = cuda_mark_set,
	.mark_free = cuda_mark_free,
	.mem_in_use = cuda_mem_in_use,
	.mem_free = cuda_mem_free,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
};
