/* cpu_device.h — internals of the CPU device shared by its source files.
 *
 * The CPU device keeps "device memory" in host memory (64-byte aligned), runs
 * elementwise, norm, attention and softmax kernels as OpenMP loops and every
 * matrix product through oneDNN. Not part of the engine's public interface:
 * only engines/device/cpu/ includes this file.
 *
 * Threading: a device is used by one thread at a time (the engine thread);
 * its scratch buffers and oneDNN primitive cache are not locked. Kernels
 * open OpenMP parallel regions with dev->threads threads (cpu_enter()).
 * Debian's libdnnl is built on the OpenMP runtime (it links libgomp): its
 * matmuls run on the same pool, with the thread count cpu_enter() sets and
 * the process's wait policy (daemon/omp_policy.h). The default count
 * (threads <= 0 at open) is the process's CPU budget (device/cpu_budget.h).
 */
#ifndef ENGINED_CPU_DEVICE_H
#define ENGINED_CPU_DEVICE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/device.h"

/* Alignment of every buffer the CPU device hands out or uses as scratch. */
#define CPU_ALIGN 64

/* Scratch buffers owned by the device, one per purpose so that a kernel can
 * hold several at once. Their content does not survive between kernels. */
enum cpu_scratch_slot {
	CPU_SCRATCH_GEMM_A = 0,   /* bf16 copy of op(A) (as fp32 where emulated) */
	CPU_SCRATCH_GEMM_B,       /* bf16 copy of op(B) (as fp32 where emulated) */
	CPU_SCRATCH_TILES,        /* per-thread attention score panels */
	CPU_SCRATCH_ROWS,         /* per-row values: attention D_i, sumsq block sums */
	CPU_SCRATCH_INDEX,        /* attention work-item table */
	CPU_SCRATCH_GEMM_C,       /* a row block of an accumulating product */
	CPU_SCRATCH_COUNT,
};

struct cpu_scratch {
	void *ptr;
	size_t bytes;
};

struct cpu_gemm_cache;

struct cpu_device {
	struct device base;                    /* first: what callers see */
	int threads;                           /* OpenMP threads of this device's kernels */
	atomic_size_t in_use;                  /* bytes handed out by alloc, not yet freed */
	struct cpu_scratch scratch[CPU_SCRATCH_COUNT];
	struct cpu_gemm_cache *gemm;           /* oneDNN engine, stream, primitives */
	/* attention backward: 0 = choose by shape and threads, 1 = two
	 * passes, 2 = fused (tests set it to cover both) */
	int attn_bwd_path;
	/* ENGINED_CPU_FAIL_AT_ALLOC=N (tests of the daemon's failure path):
	 * the N-th device allocation marks the device failed, as a sticky CUDA
	 * error would. 0 = off. */
	long fail_at_alloc;
	atomic_long allocs;
	/* A bf16 copy of the parameter region the engine declared
	 * (base.param_base, param_bytes), made once per base.param_version, so
	 * that weights are not rounded again by every MATMUL_BF16 product,
	 * and lent to consumers as a sealed file (cpu_param_bf16.c). */
	uint16_t *p16;                         /* a mapping of p16_fd; NULL: none */
	int p16_fd;
	size_t p16_file_bytes;                 /* the file's and mapping's size */
	bool p16_lent;                         /* sealed and read-only: never written */
	const void *p16_base;                  /* the region it was made for */
	size_t p16_bytes;
	uint64_t p16_version;                  /* the param_version of its values */
	/* The next copy's file, prepared by a thread of its own after a lend
	 * (the engine is usually idle then: the consumers are at work), so
	 * that the step after it does not fault in fresh memory. The fields
	 * are the thread's until it is joined. */
	pthread_t spare_thread;
	bool spare_started;
	size_t spare_bytes;
	int spare_fd;                          /* -1: the thread failed */
	void *spare_map;
};

static inline struct cpu_device *cpu_dev(struct device *dev)
{
	return (struct cpu_device *)dev;
}

/* Make the calling thread's OpenMP regions (ours and oneDNN's) use the
 * device's thread count. omp_set_num_threads() is per calling thread, so
 * every kernel entry point calls this rather than relying on open(). */
void cpu_enter(struct device *dev);

/* Scratch buffer `slot` of at least `bytes` bytes, 64-byte aligned; grows
 * (dropping the old content) as needed. Owned by the device, valid until
 * the next cpu_scratch() call on the same slot or close(). NULL when out of
 * memory (the slot is then empty). Not counted in mem_in_use. */
void *cpu_scratch(struct device *dev, enum cpu_scratch_slot slot, size_t bytes);

/* oneDNN state (cpu_gemm.c), created by open() and destroyed by close(). */
int cpu_gemm_init(struct cpu_device *cd);
void cpu_gemm_fini(struct cpu_device *cd);

/* Rounding helpers shared by the converters and the bf16 gemm path
 * (cpu_convert.c). */
void cpu_round_bf16(uint16_t *out, const float *x, int64_t n);

/* The bf16 copy of the parameter region (cpu_param_bf16.c). */
/* The copy of a compactly stored operand X (rows x cols, ld == cols) that
 * lies inside the region, made current first (one rounding of the whole
 * region per param_version), or NULL (then the caller rounds X itself). */
const uint16_t *cpu_param_bf16_of(struct device *dev, const float *X, int64_t rows,
				  int64_t cols, int64_t ld);
/* For a kernel that rewrites the whole region (AdamW): the copy's buffer
 * to round every new value into, in the same pass, instead of the next
 * product's separate sweep, when [p, p + n) is the region the engine
 * declared and a copy of it exists (products or a lend made one); else
 * NULL. A lent copy is replaced by a fresh one here. The engine has
 * already bumped param_version; the kernel rounds every element with
 * cpu_round_bf16, then calls cpu_param_bf16_refreshed() to mark the copy
 * current. */
uint16_t *cpu_param_bf16_whole(struct device *dev, const float *p, int64_t n);
void cpu_param_bf16_refreshed(struct device *dev);
/* device_ops.params_bf16: the copy when it is current and the device's
 * memory is host memory. */
const uint16_t *cpu_params_bf16(struct device *dev);
/* device_ops.params_bf16_keep and params_bf16_lend. */
int cpu_params_bf16_keep(struct device *dev);
int cpu_params_bf16_lend(struct device *dev, struct device_lent_file *ret);
/* Unmap and close the copy and the spare, joining its thread (close()). */
void cpu_param_bf16_free(struct cpu_device *cd);

/* The kernels, one group per file (cpu_gemm.c, cpu_attention.c, ...):
 * int cpu_<name>(...) for each entry of device.h's DEVICE_KERNELS, whose
 * comments state their semantics; refinements are in each file. */
#define CPU_KERNEL_DECL(name, params) int cpu_##name params;
DEVICE_KERNELS(CPU_KERNEL_DECL)
#undef CPU_KERNEL_DECL

extern const struct kernel_table cpu_kernel_table;

#endif
