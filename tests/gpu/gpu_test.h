/* gpu_test.h — helpers shared by the GPU tests (tests/gpu/): the skip rule,
 * a seeded generator, device transfers, error measures and a failure
 * count. Header-only (static functions) so each test stays one .c file.
 *
 * Skip rule: a test exits 77 (meson's "skipped") when this binary has no
 * CUDA device (stub) or the device cannot be opened because there is no
 * GPU or driver (-ENODEV); any other open failure is a test failure.
 *
 * Failures are counted, printed with their context, and turn into exit
 * status 1 at the end (gt_finish), so one run reports every broken check.
 */
#ifndef ENGINED_GPU_TEST_H
#define ENGINED_GPU_TEST_H

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/device.h"
#include "engine.h"

static int gt_failures;
static int gt_checks;

static inline void gt_check(bool ok, const char *fmt, ...)
{
	va_list ap;

	gt_checks++;
	if (ok)
		return;
	gt_failures++;
	va_start(ap, fmt);
	fputs("FAIL: ", stdout);
	vprintf(fmt, ap);
	fputc('\n', stdout);
	va_end(ap);
	fflush(stdout);
}

/* Print an informational line (numbers a reader wants to see). */
static inline void gt_note(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("  ", stdout);
	vprintf(fmt, ap);
	fputc('\n', stdout);
	va_end(ap);
	fflush(stdout);
}

static inline int gt_finish(const char *name)
{
	printf("%s: %d checks, %d failed\n", name, gt_checks, gt_failures);
	return gt_failures ? 1 : 0;
}

/* The device under test: "cuda", or what ENGINED_GPU_TEST_DEVICE names.
 * Setting it to "cpu" (with ENGINED_CPU_DISCRETE=1 for separate device
 * memory) runs a test's logic against the CPU device on a machine without
 * a GPU: a dry run of the test itself, not of the CUDA code. */
static inline const char *gt_dev_name(void)
{
	const char *e = getenv("ENGINED_GPU_TEST_DEVICE");

	return e && *e ? e : "cuda";
}

static inline bool gt_dry_run(void)
{
	return strcmp(gt_dev_name(), "cuda") != 0;
}

/* Exit 77 unless a CUDA device can be opened here. */
static inline void gt_require_gpu(const char *name)
{
	const struct device_ops *ops = device_find("cuda");
	struct device *d = NULL;
	int r;

	if (gt_dry_run()) {
		printf("%s: DRY RUN against the %s device\n", name, gt_dev_name());
		return;
	}

	if (!ops) {
		printf("%s: SKIP (CUDA device not built into this binary)\n", name);
		exit(77);
	}
	r = ops->open(&d, 0, MATMUL_FP32);
	if (r == -ENODEV) {
		printf("%s: SKIP (no GPU or no driver: cudaGetDeviceCount reports none)\n", name);
		exit(77);
	}
	if (r) {
		printf("%s: FAIL: cuda open: %s\n", name, strerror(-r));
		exit(1);
	}
	ops->close(d);
}

static inline struct device *gt_open(const char *name, enum matmul_precision prec)
{
	const struct device_ops *ops = device_find(name);
	struct device *d = NULL;
	int r;

	r = ops ? ops->open(&d, 0, prec) : -ENODEV;
	if (r) {
		printf("FAIL: open %s: %s\n", name, strerror(-r));
		exit(1);
	}
	return d;
}

static inline double gt_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: reproducible across platforms. */
static uint64_t gt_state = 0x1234567887654321ull;

static inline void gt_seed(uint64_t s)
{
	gt_state = s;
}

static inline uint64_t gt_u64(void)
{
	uint64_t z = (gt_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline float gt_uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)(gt_u64() >> 11) * 0x1.0p-53);
}

static inline void gt_fill(float *x, int64_t n, float lo, float hi)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = gt_uniform(lo, hi);
}

static inline void *gt_xmalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	if (!p) {
		printf("FAIL: out of host memory (%zu bytes)\n", bytes);
		exit(1);
	}
	return p;
}

/* Device copy of host[bytes] (allocated on d). */
static inline void *gt_up(struct device *d, const void *host, size_t bytes)
{
	void *p = d->ops->alloc(d, bytes ? bytes : 1);

	if (!p) {
		printf("FAIL: device alloc of %zu bytes on %s\n", bytes, d->ops->name);
		exit(1);
	}
	if (host && bytes && d->ops->copy_h2d(d, p, host, bytes)) {
		printf("FAIL: copy to %s\n", d->ops->name);
		exit(1);
	}
	return p;
}

/* Host copy of dev[bytes] (malloc'ed; caller frees). */
static inline void *gt_down(struct device *d, const void *dev, size_t bytes)
{
	void *h = gt_xmalloc(bytes);

	if (d->ops->copy_d2h(d, h, dev, bytes) || d->ops->sync(d)) {
		printf("FAIL: copy from %s\n", d->ops->name);
		exit(1);
	}
	return h;
}

/* max |a - b| / (max |b| + floor): the error relative to the reference's
 * scale; NaN anywhere (in one but not the other) gives +inf. */
static inline double gt_rel_err(const float *a, const float *b, int64_t n, double floor)
{
	double mx = 0, scale = 0;

	for (int64_t i = 0; i < n; i++) {
		bool na = a[i] != a[i], nb = b[i] != b[i];

		if (na || nb) {
			if (na != nb)
				return INFINITY;
			continue;
		}
		if (fabs((double)a[i] - b[i]) > mx)
			mx = fabs((double)a[i] - b[i]);
		if (fabs((double)b[i]) > scale)
			scale = fabs((double)b[i]);
	}
	return mx / (scale + floor);
}

static inline double gt_max_abs_err(const float *a, const float *b, int64_t n)
{
	double mx = 0;

	for (int64_t i = 0; i < n; i++) {
		double e = fabs((double)a[i] - b[i]);

		if (e != e)
			return INFINITY;
		if (e > mx)
			mx = e;
	}
	return mx;
}

static inline double gt_cosine(const float *a, const float *b, int64_t n)
{
	double ab = 0, aa = 0, bb = 0;

	for (int64_t i = 0; i < n; i++) {
		ab += (double)a[i] * b[i];
		aa += (double)a[i] * a[i];
		bb += (double)b[i] * b[i];
	}
	if (aa == 0 && bb == 0)
		return 1.0;
	return ab / (sqrt(aa) * sqrt(bb) + 1e-300);
}

/* ---- engine helpers ---- */

/* A small qwen2 (q/k/v bias), head_dim 64 (hidden 256, 4 heads / 2 kv),
 * untied, vocab 2048. */
static const char *const GT_QWEN2_SMALL =
	"{\"model_type\": \"qwen2\", \"vocab_size\": 2048, \"hidden_size\": 256,"
	" \"intermediate_size\": 704, \"num_hidden_layers\": 3,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
	" \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096}";

/* A small qwen3 (q/k norm), head_dim 128, tied. */
static const char *const GT_QWEN3_SMALL =
	"{\"model_type\": \"qwen3\", \"vocab_size\": 1536, \"hidden_size\": 256,"
	" \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 128,"
	" \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
	" \"tie_word_embeddings\": true, \"max_position_embeddings\": 4096}";

/* A mixture of experts (issue 31): mixtral-routed, 8 experts top-2 with
 * their auxiliary loss; initializer_range 0.1 makes the routers decisive
 * (logits ~1.6 apart), so that fp32 summation order cannot change a
 * token's experts between the devices. */
static const char *const GT_MIXTRAL_SMALL =
	"{\"model_type\": \"mixtral\", \"vocab_size\": 1536, \"hidden_size\": 256,"
	" \"intermediate_size\": 256, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
	" \"output_router_logits\": true, \"router_aux_loss_coef\": 0.02,"
	" \"initializer_range\": 0.1, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
	" \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096}";

static inline struct engine *gt_engine(const char *json, const char *device, bool bf16,
				uint64_t seed, double lr, bool offload)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = NULL;
	int rc;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = json;
	cfg.device = device;
	cfg.seed = seed;
	cfg.optim.lr = lr;
	cfg.bf16_matmul = bf16;
	cfg.param_offload = offload;
	cfg.optimizer_offload = offload;
	cfg.max_tokens_per_micro_batch = 1 << 20;
	rc = engine_create(&cfg, &e, &err);
	if (rc) {
		printf("FAIL: engine_create(%s): %s\n", device, err.msg);
		exit(1);
	}
	return e;
}

/* Mean SFT loss over the predicted tokens: L = -mean(logp[t]) over t that
 * are not the first token of their sequence; ctx is a double receiving L. */
static inline int gt_sft_loss(void *ctx, struct engine_loss_io *io, struct eng_error *err)
{
	double *loss = ctx, s = 0;
	int64_t n = 0, off = 0;

	(void)err;
	for (int32_t q = 0; q < io->num_seqs; q++)
		n += io->seq_lens[q] - 1;
	for (int32_t q = 0; q < io->num_seqs; q++) {
		for (int32_t i = 1; i < io->seq_lens[q]; i++) {
			s -= io->log_probs[off + i];
			if (!io->forward_only)
				io->d_log_probs[off + i] = (float)(-1.0 / (double)n *
						(io->grad_scale > 0 ? io->grad_scale : 1.0));
		}
		off += io->seq_lens[q];
	}
	*loss += n ? s / (double)n : 0;
	return 0;
}

/* A packed batch: `nseq` sequences with the given lengths, token ids drawn
 * from the generator in [0, vocab). */
struct gt_batch {
	int64_t n;
	int32_t nseq;
	int32_t lens[64];
	int32_t *ids;
};

static inline void gt_make_batch(struct gt_batch *b, const int32_t *lens, int32_t nseq,
			  int64_t vocab, uint64_t seed)
{
	memset(b, 0, sizeof(*b));
	b->nseq = nseq;
	for (int32_t q = 0; q < nseq; q++) {
		b->lens[q] = lens[q];
		b->n += lens[q];
	}
	b->ids = gt_xmalloc((size_t)b->n * sizeof(int32_t));
	gt_seed(seed);
	for (int64_t t = 0; t < b->n; t++)
		b->ids[t] = (int32_t)(gt_u64() % (uint64_t)vocab);
}

/* forward_backward with the SFT loss; returns the loss, fills logp[n] when
 * given. */
static inline double gt_fb(struct engine *e, const struct gt_batch *b, bool forward_only,
		    float *logp)
{
	double loss = 0;
	struct engine_batch eb = {
		.n = b->n, .input_ids = b->ids, .num_seqs = b->nseq, .seq_lens = b->lens,
		.forward_only = forward_only, .loss_fn = gt_sft_loss, .loss_ctx = &loss,
	};
	struct engine_fb_result r = {.log_probs = logp};
	struct eng_error err = {0};
	int rc = engine_forward_backward(e, &eb, &r, &err);

	if (rc) {
		printf("FAIL: forward_backward: %s\n", err.msg);
		exit(1);
	}
	return loss;
}

static inline void gt_step(struct engine *e)
{
	struct engine_step_result sr;
	struct eng_error err = {0};
	int rc = engine_optimizer_step(e, &sr, &err);

	if (rc) {
		printf("FAIL: optimizer_step: %s\n", err.msg);
		exit(1);
	}
	gt_check(!sr.skipped, "optimizer step skipped (grad norm %g)", sr.grad_norm);
}

/* FNV-1a over every parameter's fp32 bits (bit-identity checks). */
static inline uint64_t gt_param_digest(struct engine *e)
{
	struct engine_param_view v;
	struct eng_error err = {0};
	uint64_t h = 0xcbf29ce484222325ull;

	for (int64_t i = 0; i < engine_num_params(e); i++) {
		const unsigned char *p;

		if (engine_param(e, i, &v, &err)) {
			printf("FAIL: engine_param: %s\n", err.msg);
			exit(1);
		}
		p = (const unsigned char *)v.host_data;
		for (size_t k = 0; k < (size_t)v.numel * sizeof(float); k++)
			h = (h ^ p[k]) * 0x100000001b3ull;
	}
	return h;
}

#endif
