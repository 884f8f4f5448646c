/* device.h — the device interface: memory, copies and the kernel table.
 *
 * The model orchestration (engines/model), the optimizer, checkpointing and
 * batch planning are device-independent; they reach compute only through a
 * `struct device` whose ops are filled by one device implementation
 * (device/cpu, device/cuda). A device is found by name with
 * device_open(); devices that were not built are absent from the table,
 * never #ifdef'd in callers.
 *
 * Conventions for every kernel:
 *  - all float pointers are device memory from dev->ops->alloc, fp32,
 *    row-major; int32 index arrays (ids, positions, cu_seqlens) are device
 *    memory too (upload them with copy_h2d);
 *  - shapes are in the comment next to each parameter; T = tokens of the
 *    micro-batch, C = hidden size, H = query heads, KV = key/value heads,
 *    D = head dim, F = intermediate size, V = vocabulary;
 *  - "= " in a comment means the output is overwritten, "+=" means it is
 *    accumulated into (gradients of parameters always accumulate);
 *  - kernels are deterministic: the same inputs give bit-identical outputs
 *    run after run (no atomics, fixed reduction order, results independent
 *    of the thread count is NOT promised; independent of timing is);
 *  - kernels return 0 or a negative errno (-ENOMEM when scratch memory could
 *    not be had); they never log.
 */
#ifndef ENGINED_DEVICE_H
#define ENGINED_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct device;

/* One product of a grouped gemm (gemm_grouped): C[M,N] = op(A) op(B) with
 * the call's transposes and leading dimensions; device pointers. */
struct gemm_group {
	int64_t M, N, K;
	const float *A, *B;
	float *C;
};

/* Per-row running statistics of an online log-softmax (device memory). */
struct logprob_stats {
	double max;     /* max z seen so far */
	double sum;     /* sum exp(z - max) */
	double zsum;    /* sum exp(z - max) (z - max) */
	double zt;      /* z[target] once seen */
};

/* Precision of matrix products. Master weights, gradients and optimizer
 * state are always fp32; with MATMUL_BF16 the device rounds matmul inputs
 * to bf16 and accumulates in fp32. */
enum matmul_precision {
	MATMUL_FP32 = 0,
	MATMUL_BF16 = 1,
};

/* The kernels, one list: each entry's name and parameters (every kernel
 * returns 0 or a negative errno). struct kernel_table has a pointer per
 * entry, and each device declares and tables its implementations from the
 * same list (cpu_<name> in cpu_device.h and cpu_kernels.c, cuda_<name> in
 * cuda_device.h and cuda_kernels.c). The contract of each is its comment. */
#define DEVICE_KERNELS(X)                                                                   \
	/* C[M,N] = op(A) @ op(B) + beta * C, beta is 0 or 1.                               \
	 * op(A) is A[M,K] (lda >= K) or, with trans_a, A stored as [K,M] (lda >= M).       \
	 * op(B) is B[K,N] (ldb >= N) or, with trans_b, B stored as [N,K] (ldb >= K).       \
	 * ldc >= N. Linear layers y = x W^T use (trans_b=1, B = W[out,in]). */             \
	X(gemm, (struct device *dev, bool trans_a, bool trans_b,                            \
	         int64_t M, int64_t N, int64_t K, const float *A,                           \
	         int64_t lda, const float *B, int64_t ldb, float beta,                      \
	         float *C, int64_t ldc))                                                    \
	/* G products, each gemm's of groups[g] (host array; device operands), all       \
	 * with trans_a, trans_b, lda, ldb, ldc and beta: a mixture of experts'            \
	 * projection over every expert's rows at once (llama.c). A group of M 0           \
	 * or N 0 does nothing. */                                                          \
	X(gemm_grouped, (struct device *dev, bool trans_a, bool trans_b, int64_t G,         \
	                 const struct gemm_group *groups, int64_t lda, int64_t ldb,        \
	                 float beta, int64_t ldc))                                          \
                                                                                            \
	/* out[T,C] = wte[ids[t], :] ; ids in [0, V) (checked by the caller). */            \
	X(embedding_fwd, (struct device *dev, float *out,                                   \
	                  const float *wte, const int32_t *ids, int64_t T,                  \
	                  int64_t C))                                                       \
	/* dwte[V,C] += scatter of dout[T,C] by ids[T] (deterministic order),              \
	 * the rows of id skip left out (transformers' padding_idx; -1: none). */           \
	X(embedding_bwd, (struct device *dev, float *dwte,                                  \
	                  const float *dout, const int32_t *ids,                            \
	                  int64_t T, int64_t C, int64_t V, int64_t skip))                   \
                                                                                            \
	/* Per row r of R rows of width C:                                                  \
	 * rstd[r] = 1/sqrt(mean(x[r]^2) + eps); out[r] = x[r] * rstd[r] * w.               \
	 * out may alias x. rstd[R] is saved for the backward. */                           \
	X(rmsnorm_fwd, (struct device *dev, float *out, float *rstd,                        \
	                const float *x, const float *w, int64_t R,                          \
	                int64_t C, float eps))                                              \
	/* dx[R,C] = d/dx (beta_dx = 0: overwrite, 1: accumulate);                          \
	 * dw[C] += sum over rows (dw NULL: not computed, a frozen weight).                 \
	 * dx must not alias dout. */                                                       \
	X(rmsnorm_bwd, (struct device *dev, float *dx, float *dw,                           \
	                const float *dout, const float *x, const float *w,                  \
	                const float *rstd, int64_t R, int64_t C,                            \
	                float beta_dx))                                                     \
                                                                                            \
	/* Rotary embedding in place on x[T, NH, D] (NH heads), HF "rotate_half"            \
	 * layout: pairs (i, i + D/2), angle = pos[t] * inv_freq[i], i < D/2.               \
	 * inverse=true applies the transpose rotation (the backward). */                   \
	X(rope, (struct device *dev, float *x, const int32_t *pos,                          \
	         const float *inv_freq, int64_t T, int64_t NH, int64_t D,                   \
	         bool inverse))                                                             \
                                                                                            \
	/* Causal attention over packed sequences, never across them.                       \
	 * q[T,H,D], k[T,KV,D], v[T,KV,D]; H % KV == 0 (head h reads kv head                \
	 * h / (H/KV)); cu_seqlens[B+1] with cu_seqlens[0]=0, cu_seqlens[B]=T.              \
	 * out[T,H,D] = softmax(scale * q k^T + causal mask) v;                             \
	 * lse[H,T] = log-sum-exp of the scaled scores (saved for backward).                \
	 * Memory must be O(T): tiles, never a T x T matrix. */                             \
	X(attention_fwd, (struct device *dev, float *out, float *lse,                       \
	                  const float *q, const float *k, const float *v,                   \
	                  const int32_t *cu_seqlens, int64_t B, int64_t T,                  \
	                  int64_t H, int64_t KV, int64_t D, float scale))                   \
	/* dq[T,H,D] =, dk[T,KV,D] =, dv[T,KV,D] = (overwritten), from                      \
	 * dout[T,H,D] and the forward's q, k, v, out, lse. */                              \
	X(attention_bwd, (struct device *dev, float *dq, float *dk,                         \
	                  float *dv, const float *dout, const float *q,                     \
	                  const float *k, const float *v,                                   \
	                  const float *out, const float *lse,                               \
	                  const int32_t *cu_seqlens, int64_t B, int64_t T,                  \
	                  int64_t H, int64_t KV, int64_t D, float scale))                   \
                                                                                            \
	/* A paged key/value cache (engines/model/kv_cache.h): one layer's keys             \
	 * and values, each [nblocks, block, KV, D]. kv_write: k[T,KV,D] and                \
	 * v[T,KV,D] into slots[T] (slot = block index x block + offset;                    \
	 * distinct slots). */                                                              \
	X(kv_write, (struct device *dev, float *kcache, float *vcache,                      \
	             const float *k, const float *v, const int32_t *slots,                  \
	             int64_t T, int64_t KV, int64_t D))                                     \
	/* Token t, at position pos[t] of a sequence whose blocks are listed at             \
	 * tables + table_off[t] (position j in block tables[table_off[t] +                 \
	 * j / block], at offset j % block; the caller's table covers 0 ..                  \
	 * pos[t]), attends to positions 0 .. pos[t] (written first, its own                \
	 * included): out[T,H,D] = softmax(scale q k^T) v, q[T,H,D], head h                 \
	 * reading kv head h / (H/KV). */                                                   \
	X(attention_paged, (struct device *dev, float *out, const float *q,                 \
	                    const float *kcache, const float *vcache,                       \
	                    const int32_t *tables, const int32_t *table_off,                \
	                    const int32_t *pos, int64_t T, int64_t H, int64_t KV,           \
	                    int64_t D, int64_t block, float scale))                         \
                                                                                            \
	/* out[T,F] = silu(gate) * up. */                                                   \
	X(swiglu_fwd, (struct device *dev, float *out, const float *gate,                   \
	               const float *up, int64_t n))                                         \
	/* dgate =, dup = from dout and the forward inputs (n = T*F). */                    \
	X(swiglu_bwd, (struct device *dev, float *dgate, float *dup,                        \
	               const float *dout, const float *gate,                                \
	               const float *up, int64_t n))                                         \
                                                                                            \
	/* Mixture of experts (llama.c). moe_route_fwd: per row t of probs[T,E],          \
	 * which holds the router's logits on entry: probs = softmax of them; idx[t]      \
	 * the k experts of highest probability, highest first (ties: the lower           \
	 * index), or when forced the k given in idx[t] on entry (routing replay:         \
	 * ids in [0, E), distinct within a row, which the caller checked);               \
	 * w[t,j] = probs[t, idx[t,j]], divided by their sum when norm.                   \
	 * moe_route_bwd: dz[T,E] = (overwritten) the gradient of the logits from         \
	 * dw[T,k] and the forward's probs, idx and w, plus aux[E] (NULL: none) as        \
	 * every row's gradient of its probabilities (the auxiliary loss's). */           \
	X(moe_route_fwd, (struct device *dev, float *probs, int32_t *idx, float *w,        \
	                  int64_t T, int64_t E, int64_t k, bool norm, bool forced))        \
	X(moe_route_bwd, (struct device *dev, float *dz, const float *dw,                  \
	                  const float *probs, const int32_t *idx, const float *w,          \
	                  const float *aux, int64_t T, int64_t E, int64_t k, bool norm))   \
	/* dst[r] = src[rows[r]] for r < R, rows of C floats. */                           \
	X(rows_gather, (struct device *dev, float *dst, const float *src,                  \
	                const int32_t *rows, int64_t R, int64_t C))                        \
	/* out[t] = sum over j of w[t,j] y[pos[t,j]] (w NULL: 1), the k terms             \
	 * added to zero in ascending pos (transformers' order: by expert), rows          \
	 * of C floats; distinct pos. */                                                  \
	X(moe_combine, (struct device *dev, float *out, const float *y,                    \
	                const int32_t *pos, const float *w, int64_t T, int64_t k,         \
	                int64_t C))                                                       \
	/* Its backward: dy[pos[t,j]] = w[t,j] dout[t] (overwritten), dw[t,j] =           \
	 * dout[t] . y[pos[t,j]]. */                                                      \
	X(moe_combine_bwd, (struct device *dev, float *dy, float *dw,                      \
	                    const float *dout, const float *y, const int32_t *pos,        \
	                    const float *w, int64_t T, int64_t k, int64_t C))             \
	/* A shared expert's gated share (qwen2_moe): out[t] += sigmoid(z[t]) y[t],       \
	 * rows of C floats; its backward dy[t] = s dout[t] (overwritten) and dz[t]       \
	 * = s (1 - s) (dout[t] . y[t]), s = sigmoid(z[t]). */                            \
	X(sigmoid_gate_fwd, (struct device *dev, float *out, const float *z,               \
	                     const float *y, int64_t T, int64_t C))                        \
	X(sigmoid_gate_bwd, (struct device *dev, float *dy, float *dz,                     \
	                     const float *dout, const float *z, const float *y,            \
	                     int64_t T, int64_t C))                                        \
                                                                                            \
	/* x[R,N] += bias[N] on every row. */                                               \
	X(bias_add, (struct device *dev, float *x, const float *bias,                       \
	             int64_t R, int64_t N))                                                 \
	/* dbias[N] += column sums of dout[R,N]. */                                         \
	X(bias_bwd, (struct device *dev, float *dbias, const float *dout,                   \
	             int64_t R, int64_t N))                                                 \
                                                                                            \
	/* y[n] = a * x[n] + b * y[n]  (b = 0 means overwrite, y may hold NaN). */          \
	X(axpby, (struct device *dev, float *y, float a, const float *x,                    \
	          float b, int64_t n))                                                      \
                                                                                            \
	/* Rows of logits[R,V] at temperature: z = logits * inv_temp;                       \
	 * logp[r] = z[target[r]] - logsumexp(z); ent[r] = -sum softmax(z) log softmax(z).  \
	 * target[r] < 0 means "no target": logp[r] = 0 (ent still computed). */            \
	X(logprob_fwd, (struct device *dev, float *logp, float *ent,                        \
	                const float *logits, const int32_t *target,                         \
	                int64_t R, int64_t V, float inv_temp))                              \
	/* In place: logits[R,V] (the same values as in the forward) become                 \
	 * dlogits = inv_temp * (dlogp * (onehot(target) - p) - dent * p * (z - sum p z)).  \
	 * Rows with target < 0 get only the entropy term. */                               \
	X(logprob_bwd, (struct device *dev, float *logits,                                  \
	                const int32_t *target, const float *dlogp,                          \
	                const float *dent, int64_t R, int64_t V,                            \
	                float inv_temp))                                                    \
                                                                                            \
	/* The same over vocabulary chunks, so that the LM head reads its                   \
	 * weight once per pass however many tokens there are (online softmax).             \
	 * logits[R, Vc] holds columns [v0, v0 + Vc) of R rows (row stride Vc).             \
	 * stats[R] carries per row, in double: max z, S = sum exp(z - max),                \
	 * Z = sum exp(z - max) (z - max), and z[target] (when the target falls             \
	 * in a chunk). first = true starts the rows; later chunks merge. */                \
	X(logprob_chunk_fwd, (struct device *dev,                                           \
	                      struct logprob_stats *stats,                                  \
	                      const float *logits, const int32_t *target,                   \
	                      int64_t R, int64_t v0, int64_t Vc,                            \
	                      float inv_temp, bool first))                                  \
	/* After the last chunk: lse = max + log S; logp = z[target] - lse (0               \
	 * without a target); ent = log S - Z / S; ez = max + Z / S (= sum p z).            \
	 * lse[R] and ez[R] are kept for logprob_chunk_bwd. ent may be NULL. */             \
	X(logprob_chunk_finish, (struct device *dev, float *logp,                           \
	                         float *ent, float *lse, float *ez,                         \
	                         const struct logprob_stats *stats,                         \
	                         const int32_t *target, int64_t R))                         \
	/* In place on a chunk of the same logits: p = exp(z - lse),                        \
	 * dlogits = inv_temp * (dlogp * (onehot(target) - p) - dent * p * (z - ez)). */    \
	X(logprob_chunk_bwd, (struct device *dev, float *logits,                            \
	                      const int32_t *target, const float *lse,                      \
	                      const float *ez, const float *dlogp,                          \
	                      const float *dent, int64_t R, int64_t v0,                     \
	                      int64_t Vc, float inv_temp))                                  \
                                                                                            \
	/* Sum of squares of x[n] in double, fixed reduction order. */                      \
	X(sumsq, (struct device *dev, double *ret, const float *x,                          \
	          int64_t n))                                                               \
	/* Returns true in *ret when every x[n] is finite. */                               \
	X(all_finite, (struct device *dev, bool *ret, const float *x,                       \
	               int64_t n))                                                          \
                                                                                            \
	/* One torch.optim.AdamW step over flat arrays, n elements:                         \
	 *   g = grad * grad_scale                                                          \
	 *   p *= 1 - lr * weight_decay                                                     \
	 *   m = beta1 * m + (1 - beta1) * g                                                \
	 *   v = beta2 * v + (1 - beta2) * g * g                                            \
	 *   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)        \
	 *   grad = 0   (the step consumes the gradients: zeroing them in the same          \
	 *              pass saves a second sweep over 4 bytes a parameter)                 \
	 * step >= 1 is the step count after this update; weight decay applies to           \
	 * every element. The hyper-parameters are doubles, as torch's Python               \
	 * floats are: scalars such as 1 - beta2 are formed in double and rounded           \
	 * to fp32 once, so passing the config's doubles reproduces torch.                  \
	 * The engine bumps param_version before the call: a device that                    \
	 * caches derived copies of the parameters may refresh them in the                  \
	 * same pass when p is the whole declared region. */                                \
	X(adamw, (struct device *dev, float *p, float *grad, float *m,                      \
	          float *v, int64_t n, double lr, double beta1,                             \
	          double beta2, double eps, double weight_decay,                            \
	          int64_t step, float grad_scale))                                          \
                                                                                            \
	/* Round x[n] to bf16 (round to nearest even; NaN stays NaN) into                   \
	 * out[n] (uint16 bits) / to IEEE half (out[n] uint16 bits). */                     \
	X(to_bf16, (struct device *dev, uint16_t *out, const float *x,                      \
	            int64_t n))                                                             \
	X(to_f16, (struct device *dev, uint16_t *out, const float *x,                       \
	           int64_t n))

struct kernel_table {
#define KERNEL_POINTER(name, params) int (*name) params;
	DEVICE_KERNELS(KERNEL_POINTER)
#undef KERNEL_POINTER
};

/* A file holding a copy of device state, lent to its caller
 * (params_bf16_lend). */
struct device_lent_file {
	int fd;                       /* the caller's */
	size_t bytes;                 /* the file's size */
	const void *base;             /* the copy as this process maps it */
};

struct device_ops {
	const char *name;                    /* "cpu", "cuda" */
	/* Open / close a device. threads <= 0 means the device's default (the
	 * CPU device: the process's CPU budget, device/cpu_budget.h). */
	int (*open)(struct device **ret, int threads, enum matmul_precision prec);
	void (*close)(struct device *dev);   /* accepts NULL */

	/* Device memory. alloc returns NULL when out of memory; the memory is
	 * not initialised. free accepts NULL. */
	void *(*alloc)(struct device *dev, size_t bytes);
	void (*free)(struct device *dev, void *ptr);
	/* copy_h2d and copy_d2h are complete when they return (the host
	 * buffer may be reused or read at once); memset0 and copy_d2d may be
	 * queued, ordered with the kernels. */
	int (*memset0)(struct device *dev, void *ptr, size_t bytes);
	int (*copy_h2d)(struct device *dev, void *dst, const void *src, size_t bytes);
	int (*copy_d2h)(struct device *dev, void *dst, const void *src, size_t bytes);
	int (*copy_d2d)(struct device *dev, void *dst, const void *src, size_t bytes);
	/* Wait until all queued work is done. */
	int (*sync)(struct device *dev);
	/* Marks in the device's queue, for work that another library queues
	 * elsewhere (the collectives of dist.h, on a stream of their own) to
	 * wait for: mark_set makes `mark` the point after every piece of work
	 * queued so far. NULL on devices that queue nothing (the CPU: work is
	 * done when its call returns, so there is nothing to wait for).
	 * mark_new returns NULL when out of resources; mark_free accepts NULL. */
	void *(*mark_new)(struct device *dev);
	int (*mark_set)(struct device *dev, void *mark);
	void (*mark_free)(struct device *dev, void *mark);
	/* Bytes of device memory in use by this device's allocations. */
	size_t (*mem_in_use)(struct device *dev);
	/* Bytes the device could still hand out now (free memory as the
	 * system reports it: MemAvailable and the cgroup limit on the CPU,
	 * cudaMemGetInfo on CUDA), for refusing a model that cannot fit
	 * before allocating it; SIZE_MAX when unknown. */
	size_t (*mem_free)(struct device *dev);
	/* Host memory for offloaded state and staging: page-locked where that
	 * makes copies faster (cudaHostAlloc), plain aligned memory on the CPU.
	 * NULL when out of memory; host_free accepts NULL. */
	void *(*host_alloc)(struct device *dev, size_t bytes);
	void (*host_free)(struct device *dev, void *ptr);
	/* The bf16 copy of the declared parameter region (param_base,
	 * param_bytes) that MATMUL_BF16 products keep, when it is in host
	 * memory and holds the values of param_version, rounded by
	 * engines/io/round.h; else NULL. Valid until the parameters or their
	 * placement change. Optional: NULL on devices that keep no such copy
	 * in host memory. */
	const uint16_t *(*params_bf16)(struct device *dev);
	/* Make that copy current now (rounded if it is stale or absent, also
	 * with fp32 products) and keep it current from then on (AdamW
	 * refreshes it). -ENOTSUP (no host memory, no region), -ENOMEM.
	 * Optional. */
	int (*params_bf16_keep)(struct device *dev);
	/* That copy, made current first (params_bf16_keep), lent as a file
	 * that can never change: *ret gets a new descriptor (the caller's)
	 * sealed with F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
	 * F_SEAL_SEAL, its size, and where the copy lies in this process (params_bf16 returns the same base until the parameters
	 * change; element k of the region is at byte 2k of the file). The
	 * device writes later values into a new file. -ENOTSUP when the
	 * device cannot (no host memory, no region), -ENOMEM, or a -errno of
	 * memfd_create / mmap / fcntl. Optional. */
	int (*params_bf16_lend)(struct device *dev, struct device_lent_file *ret);
};

/* Every device has this as its first member. */
struct device {
	const struct device_ops *ops;
	const struct kernel_table *k;
	enum matmul_precision prec;
	/* How this device's products run, in words (for the log and
	 * GetStatus): "fp32 (oneDNN avx512_core)", or a bf16 path that the
	 * CPU lacks done another way. Set by open; the device's storage,
	 * valid until close. */
	const char *matmul;
	/* True when device memory is host memory: copies are memcpy and
	 * "offload" only changes the reported placement. The CPU device opened
	 * with ENGINED_CPU_DISCRETE=1 in the environment reports false and keeps
	 * separate device / host allocations, so that tests exercise the real
	 * offload path of devices with their own memory. */
	bool host_memory;
	/* Bumped by the engine whenever parameter values change (optimizer
	 * step, load, placement). A device may cache derived copies of
	 * parameters (bf16 weights for its matmuls), keyed by pointer, while
	 * the version is unchanged. */
	uint64_t param_version;
	/* Where the parameters live in device memory, declared by the engine
	 * whenever it binds them (NULL / 0 while they are offloaded). Derived
	 * copies may be cached only for operands inside this range: gemm
	 * operands elsewhere (activations) change without a version bump. */
	const void *param_base;
	size_t param_bytes;
	/* NULL while the device works. After an unrecoverable error (a sticky
	 * CUDA error: illegal address, ECC, ...) the device sets it to the
	 * error's name (static storage) and every later call fails with -EIO
	 * (alloc returns NULL): the engine must report itself failed and the
	 * process restart. The CPU device never sets it. */
	const char *failed;
};

/* Devices built into this binary, by name. */
const struct device_ops *device_find(const char *name);
/* Comma-separated names of the built devices, for error messages. */
const char *device_names(void);

/* Fault injection (tests; STYLE "fault sweeps"): after `n` more successful
 * device allocations, every device allocation fails (alloc returns NULL)
 * until called again with n < 0. Devices call device_alloc_fault() first
 * in their alloc. Process-wide. */
void device_fail_allocs_after(long n);
bool device_alloc_fault(void);

/* The CPU device (always built). */
extern const struct device_ops cpu_device_ops;
/* The CUDA device: engines/device/cuda/ when meson finds nvcc, else
 * engines/device/cuda_stub.c, whose `name` is NULL (device_find skips it). */
extern const struct device_ops cuda_device_ops;

#endif
