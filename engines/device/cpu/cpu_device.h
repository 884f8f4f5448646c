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

/* The kernels, one group per file; semantics are those of struct
 * kernel_table in device/device.h, refinements are in each file. */
int cpu_gemm(struct device *dev, bool trans_a, bool trans_b,
	     int64_t M, int64_t N, int64_t K,
	     const float *A, int64_t lda, const float *B, int64_t ldb,
	     float beta, float *C, int64_t ldc);

int cpu_embedding_fwd(struct device *dev, float *out, const float *wte,
		      const int32_t *ids, int64_t T, int64_t C);
int cpu_embedding_bwd(struct device *dev, float *dwte, const float *dout,
		      const int32_t *ids, int64_t T, int64_t C, int64_t V);
int cpu_rope(struct device *dev, float *x, const int32_t *pos,
	     const float *inv_freq, int64_t T, int64_t NH, int64_t D,
	     bool inverse);
int cpu_swiglu_fwd(struct device *dev, float *out, const float *gate,
		   const float *up, int64_t n);
int cpu_swiglu_bwd(struct device *dev, float *dgate, float *dup,
		   const float *dout, const float *gate, const float *up,
		   int64_t n);
int cpu_bias_add(struct device *dev, float *x, const float *bias,
		 int64_t R, int64_t N);
int cpu_bias_bwd(struct device *dev, float *dbias, const float *dout,
		 int64_t R, int64_t N);
int cpu_axpby(struct device *dev, float *y, float a, const float *x,
	      float b, int64_t n);

int cpu_rmsnorm_fwd(struct device *dev, float *out, float *rstd,
		    const float *x, const float *w, int64_t R, int64_t C,
		    float eps);
int cpu_rmsnorm_bwd(struct device *dev, float *dx, float *dw,
		    const float *dout, const float *x, const float *w,
		    const float *rstd, int64_t R, int64_t C, float beta_dx);

int cpu_attention_fwd(struct device *dev, float *out, float *lse,
		      const float *q, const float *k, const float *v,
		      const int32_t *cu_seqlens, int64_t B, int64_t T,
		      int64_t H, int64_t KV, int64_t D, float scale);
int cpu_attention_bwd(struct device *dev, float *dq, float *dk, float *dv,
		      const float *dout, const float *q, const float *k,
		      const float *v, const float *out, const float *lse,
		      const int32_t *cu_seqlens, int64_t B, int64_t T,
		      int64_t H, int64_t KV, int64_t D, float scale);

int cpu_logprob_fwd(struct device *dev, float *logp, float *ent,
		    const float *logits, const int32_t *target,
		    int64_t R, int64_t V, float inv_temp);
int cpu_logprob_chunk_fwd(struct device *dev, struct logprob_stats *stats,
			  const float *logits, const int32_t *target,
			  int64_t R, int64_t v0, int64_t Vc, float inv_temp, bool first);
int cpu_logprob_chunk_finish(struct device *dev, float *logp, float *ent, float *lse,
			     float *ez, const struct logprob_stats *stats,
			     const int32_t *target, int64_t R);
int cpu_logprob_chunk_bwd(struct device *dev, float *logits, const int32_t *target,
			  const float *lse, const float *ez, const float *dlogp,
			  const float *dent, int64_t R, int64_t v0, int64_t Vc,
			  float inv_temp);
int cpu_logprob_bwd(struct device *dev, float *logits, const int32_t *target,
		    const float *dlogp, const float *dent,
		    int64_t R, int64_t V, float inv_temp);

int cpu_sumsq(struct device *dev, double *ret, const float *x, int64_t n);
int cpu_all_finite(struct device *dev, bool *ret, const float *x, int64_t n);
int cpu_adamw(struct device *dev, float *p, float *grad, float *m,
	      float *v, int64_t n, double lr, double beta1, double beta2,
	      double eps, double weight_decay, int64_t step, float grad_scale);

int cpu_to_bf16(struct device *dev, uint16_t *out, const float *x, int64_t n);
int cpu_to_f16(struct device *dev, uint16_t *out, const float *x, int64_t n);

extern const struct kernel_table cpu_kernel_table;

#endif
