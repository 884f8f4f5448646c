/* llama.c — Llama-family forward/backward over the device kernel table.
 *
 * Shapes: T tokens, C hidden, H/KV heads, D head dim, QD = H*D, KD = KV*D,
 * F intermediate, V vocabulary, L layers.
 *
 * Per layer l (x_l [T,C] is the residual stream entering the layer):
 *   ln1  = rmsnorm(x_l) * w.ln1
 *   q    = ln1 Wq^T (+bq) [T,QD];  k, v = ln1 Wk^T, ln1 Wv^T (+bias) [T,KD]
 *   q, k = rmsnorm per head (qwen3), then RoPE
 *   att  = causal attention within each sequence [T,QD]
 *   xmid = x_l + att Wo^T
 *   ln2  = rmsnorm(xmid) * w.ln2
 *   x_{l+1} = xmid + (silu(ln2 Wg^T) * (ln2 Wu^T)) Wd^T
 * then lnf = rmsnorm(x_L) * w.norm, and either the LM head or the value head.
 *
 * LM head: tiles of [rows, vocabulary chunk] (at most m->lm_tile floats)
 * are computed and folded into per-row online-softmax statistics; the
 * backward turns each tile into dlogits with the saved lse / E[z].
 * Iterating vocabulary chunks inside row blocks reads the [V, C] weight
 * and adds into each row of its gradient once per row block (up to
 * tile / 2048 rows: 1024 by default). Where the tiles live:
 *  - a training forward whose logits [T, V] fit m->lm_cache floats keeps
 *    every tile (the "logits cache", part of the arena) and the backward
 *    uses them as they are: the recompute costs 2 V C flops a token, ~9%
 *    of a Qwen2.5-0.5B training step;
 *  - otherwise (forward-only, value models have no head, or more tokens
 *    than the budget allows) one scratch tile is reused, and the backward
 *    recomputes each tile with the same product from the same inputs.
 * Either way a tile is the same gemm writing [R, Vc] with row stride Vc,
 * so the gradients are bit for bit the same with or without the cache.
 *
 * LoRA (m->lora, lora.h): each projection the adapter targets adds
 * scale (x A^T) B^T to its output, through the adapter's scratch; the
 * backward recomputes x A^T from the saved input x and adds dA, dB and
 * the input gradient scale (dy B) A. With a frozen base (m->frozen) no
 * weight of the base gets a gradient.
 *
 * Activation recompute (m->recompute, gradient checkpointing): a training
 * forward keeps each layer's input x_l only, all layers sharing one slot
 * for the rest; the backward runs each layer's forward again from x_l
 * before its backward. The kernels and their inputs are those of the
 * first forward, so the gradients are bit for bit the same; the arena
 * drops from L layers' activations to one layer's plus L inputs.
 *
 * Errors: every step goes through a helper that records the first kernel
 * error in m->rc and makes later steps no-ops; a pass returns m->rc.
 */
#include "llama.h"

#include "checked.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Floats per sub-buffer are rounded up to keep 64-byte alignment. */
static size_t al(size_t n)
{
	return (n + 15) & ~(size_t)15;
}

struct layer_acts {
	float *x;              /* [T,C] layer input (residual) */
	float *ln1, *rstd1;    /* [T,C], [T] */
	float *q, *k, *v;      /* [T,QD], [T,KD], [T,KD] after norm + RoPE */
	float *qpre, *kpre;    /* [T,QD], [T,KD] before q/k norm (qwen3) */
	float *qrstd, *krstd;  /* [T*H], [T*KV] (qwen3) */
	float *att, *lse;      /* [T,QD], [H,T] */
	float *xmid;           /* [T,C] */
	float *ln2, *rstd2;    /* [T,C], [T] */
	float *gate, *up;      /* [T,F], [T,F] (dense layers) */
	/* A mixture-of-experts layer: its T k choices, R = T k rows grouped
	 * by expert (moe_group) */
	float *probs;          /* [T,E] the router's softmax */
	int32_t *idx, *pos;    /* [T,k] the chosen experts; each choice's row */
	float *wts;            /* [T,k] their weights */
	int32_t *tok;          /* [R] the token of each row */
	float *xg, *eg, *eu;   /* [R,C] the rows' inputs; [R,I] gate, up */
	float *ey;             /* [R,C] the experts' outputs */
	/* qwen2_moe's shared expert: gate, up [T,S]; output [T,C] before its
	 * gate; the gate's logit [T] */
	float *sg, *su, *sy, *sz;
};

struct global_acts {
	float *resid[2];       /* [T,C] forward-only residual ping-pong */
	float *xL, *lnf, *rstdf; /* [T,C], [T,C], [T] */
	float *s1, *s2, *s3;   /* [T,F] / [R,I] scratch (mlp_floats) */
	float *moe_dy;         /* [R,C] experts' output gradients, then input's */
	float *moe_dw, *moe_dz;/* [T,k] choice weights', [T,E] router logits' */
	float *moe_psum;       /* [E] the forward's probabilities summed over rows */
	float *moe_aux;        /* [E] the auxiliary loss's gradient of a probability */
	float *dx, *dln;       /* [T,C] */
	float *datt, *dq;      /* [T,QD] */
	float *dk, *dv;        /* [T,KD] */
	float *logits;         /* [lm_rows, lm_cols] tile, or [T,V] cached tiles */
	bool lm_cached;        /* logits is the cache (lm_tile_at) */
	float *lse, *ez;       /* [T] saved by the LM head forward */
	struct logprob_stats *stats; /* [T] */
};

/* A layer's MLP activations, per kind the model has: dense gate and up;
 * the experts' routing and rows (layer_acts). */
static size_t dense_floats(const struct model_config *c, int64_t T)
{
	return model_has_dense(c) ? 2 * al(T * c->intermediate_size) : 0;
}

static size_t experts_floats(const struct model_config *c, int64_t T)
{
	int64_t R = T * c->experts_per_tok;

	if (!model_has_experts(c))
		return 0;
	return al(T * c->num_experts) + 4 * al(R) + 2 * al(R * c->hidden_size) +
	       2 * al(R * c->moe_intermediate_size) +
	       (c->shared_expert_size ? 2 * al(T * c->shared_expert_size) +
					al(T * c->hidden_size) + al(T) : 0);
}

/* Floats of the MLP scratch buffers s1..s3: a dense layer's [T,F], an
 * experts layer's [R,I] and its shared expert's [T,S]. */
static int64_t mlp_floats(const struct model_config *c, int64_t T)
{
	int64_t dense = model_has_dense(c) ? T * c->intermediate_size : 0;
	int64_t moe = model_has_experts(c) ? T * c->experts_per_tok * c->moe_intermediate_size : 0;
	int64_t shared = model_has_experts(c) ? T * c->shared_expert_size : 0;

	moe = moe > shared ? moe : shared;
	return dense > moe ? dense : moe;
}

static size_t layer_floats(const struct model_config *c, int64_t T)
{
	int64_t QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
	size_t n = 0;

	n += 4 * al(T * c->hidden_size);            /* x, ln1, xmid, ln2 */
	n += 2 * al(T);                             /* rstd1, rstd2 */
	n += al(T * QD) * 2 + al(T * KD) * 2;       /* q, att, k, v */
	n += al(c->num_heads * T);                  /* lse */
	n += dense_floats(c, T) + experts_floats(c, T);
	if (c->qk_norm)
		n += al(T * QD) + al(T * KD) + al(T * c->num_heads) + al(T * c->num_kv_heads);
	return n;
}

/* Logits tile: up to `tile` floats (LLAMA_LM_TILE_DEFAULT, 8 MiB), as
 * rows x vocabulary columns: up to tile / LM_MIN_COLS rows, then as many
 * columns as fit, so the weight is re-read once per row block only. */
#define LM_MIN_COLS 2048

static int64_t lm_rows(int64_t tile, int64_t T)
{
	int64_t max_rows = tile / LM_MIN_COLS > 0 ? tile / LM_MIN_COLS : 1;

	return T < 1 ? 1 : (T < max_rows ? T : max_rows);
}

static int64_t lm_cols(int64_t tile, const struct model_config *c, int64_t T)
{
	int64_t cols = tile / lm_rows(tile, T);

	cols = cols > 0 ? cols : 1;
	return cols < c->vocab_size ? cols : c->vocab_size;
}

/* Whether a pass over T tokens keeps the LM head's logits [T, V] for the
 * backward: training passes of language models whose logits fit the
 * budget. The one rule: the arena's size and its layout both follow it. */
static bool lm_cache_fits(const struct llama_model *m, int64_t T, bool training)
{
	int64_t n;

	return training && !m->value_model && ck_mul_i64(T, m->cfg.vocab_size, &n) &&
	       n <= m->lm_cache;
}

/* Floats of the LM head's logits: the whole [T, V] when cached, else one
 * tile. */
static size_t lm_logits_floats(const struct llama_model *m, int64_t T, bool cached)
{
	if (cached)
		return al(T * m->cfg.vocab_size);
	return al(lm_rows(m->lm_tile, T) * lm_cols(m->lm_tile, &m->cfg, T));
}

static size_t global_floats(const struct llama_model *m, int64_t T, bool lm_cached)
{
	const struct model_config *c = &m->cfg;
	int64_t QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
	size_t C = al(T * c->hidden_size);
	size_t head = m->value_model ? 0
				     : lm_logits_floats(m, T, lm_cached) + 2 * al(T) +
				       al(T * sizeof(struct logprob_stats) / sizeof(float));

	size_t moe = model_has_experts(c) ? al(T * c->experts_per_tok * c->hidden_size) +
					    al(T * c->experts_per_tok) + al(T * c->num_experts) +
					    2 * al(c->num_experts) : 0;

	return 6 * C + al(T) + 3 * al(mlp_floats(c, T)) +
	       2 * al(T * QD) + 2 * al(T * KD) + head + moe;
}

/* Floats of the layers' part of the arena: every layer's activations
 * (training), or with recompute one layer's plus every layer's input x_l
 * (the recomputation's starting points), or one layer's (forward-only). */
static size_t layers_floats(const struct llama_model *m, int64_t T, bool training,
			    bool recompute)
{
	if (training && recompute)
		return layer_floats(&m->cfg, T) + m->cfg.num_layers * al(T * m->cfg.hidden_size);
	return (training ? m->cfg.num_layers : 1) * layer_floats(&m->cfg, T);
}

size_t llama_activation_bytes(const struct llama_model *m, int64_t T, bool training)
{
	return sizeof(float) * (layers_floats(m, T, training, m->recompute) +
				global_floats(m, T, lm_cache_fits(m, T, training)));
}

int llama_reserve(struct llama_model *m, int64_t T, bool training,
		  struct eng_error *err)
{
	size_t need = llama_activation_bytes(m, T, training) / sizeof(float);
	float *a;

	if (m->moe_off && m->moe_host_cap < T) {
		int32_t *h = malloc((size_t)(3 * T * m->cfg.experts_per_tok) * sizeof(*h));

		if (!h)
			return eng_fail(err, -ENOMEM, "experts: out of host memory for %lld "
					"tokens", (long long)T);
		free(m->moe_host);
		m->moe_host = h;
		m->moe_host_cap = T;
	}

	if (m->arena && need <= m->arena_floats) {
		m->cap_tokens = T;
		m->cap_training = training;
		m->cap_lm_cache = lm_cache_fits(m, T, training);
		m->cap_recompute = training && m->recompute;
		return 0;
	}
	a = m->dev->ops->alloc(m->dev, need * sizeof(float));
	if (!a)
		return eng_fail(err, -ENOMEM,
				"activations: cannot allocate %zu MiB for %lld tokens",
				need * sizeof(float) >> 20, (long long)T);
	m->dev->ops->free(m->dev, m->arena);
	m->arena = a;
	m->arena_floats = need;
	m->cap_tokens = T;
	m->cap_training = training;
	m->cap_lm_cache = lm_cache_fits(m, T, training);
	m->cap_recompute = training && m->recompute;
	return 0;
}

/* Carve the arena for T tokens. Layer slot l (training) or slot 0; with
 * recompute every layer shares slot 0 but its own input x_l, kept after
 * it. */
static void layer_acts_at(const struct llama_model *m, int64_t T, int64_t slot,
			  struct layer_acts *a)
{
	const struct model_config *c = &m->cfg;
	int64_t QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
	bool shared = m->cap_training && m->cap_recompute;
	float *p = m->arena + (shared ? 0 : slot) * layer_floats(c, T);
	float *x_l = m->arena + layer_floats(c, T) + slot * al(T * c->hidden_size);

#define TAKE(n) (p += al(n), p - al(n))
	memset(a, 0, sizeof(*a));
	a->x = TAKE(T * c->hidden_size);
	a->ln1 = TAKE(T * c->hidden_size);
	a->xmid = TAKE(T * c->hidden_size);
	a->ln2 = TAKE(T * c->hidden_size);
	a->rstd1 = TAKE(T);
	a->rstd2 = TAKE(T);
	a->q = TAKE(T * QD);
	a->att = TAKE(T * QD);
	a->k = TAKE(T * KD);
	a->v = TAKE(T * KD);
	a->lse = TAKE(c->num_heads * T);
	if (model_has_dense(c)) {
		a->gate = TAKE(T * c->intermediate_size);
		a->up = TAKE(T * c->intermediate_size);
	}
	if (model_has_experts(c)) {
		int64_t R = T * c->experts_per_tok;

		a->probs = TAKE(T * c->num_experts);
		a->idx = (int32_t *)TAKE(R);
		a->pos = (int32_t *)TAKE(R);
		a->wts = TAKE(R);
		a->tok = (int32_t *)TAKE(R);
		a->xg = TAKE(R * c->hidden_size);
		a->ey = TAKE(R * c->hidden_size);
		a->eg = TAKE(R * c->moe_intermediate_size);
		a->eu = TAKE(R * c->moe_intermediate_size);
		if (c->shared_expert_size) {
			a->sg = TAKE(T * c->shared_expert_size);
			a->su = TAKE(T * c->shared_expert_size);
			a->sy = TAKE(T * c->hidden_size);
			a->sz = TAKE(T);
		}
	}
	if (c->qk_norm) {
		a->qpre = TAKE(T * QD);
		a->kpre = TAKE(T * KD);
		a->qrstd = TAKE(T * c->num_heads);
		a->krstd = TAKE(T * c->num_kv_heads);
	}
	if (shared)
		a->x = x_l;
}

/* The passes of one reservation all keep the cache or all recompute (its
 * decision for cap_tokens): T <= cap_tokens then fits either way. */
static void global_acts_at(const struct llama_model *m, int64_t T, bool training,
			   struct global_acts *g)
{
	const struct model_config *c = &m->cfg;
	int64_t QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
	float *p = m->arena + layers_floats(m, T, training, training && m->cap_recompute);

	g->resid[0] = TAKE(T * c->hidden_size);
	g->resid[1] = TAKE(T * c->hidden_size);
	g->xL = TAKE(T * c->hidden_size);
	g->lnf = TAKE(T * c->hidden_size);
	g->dx = TAKE(T * c->hidden_size);
	g->dln = TAKE(T * c->hidden_size);
	g->rstdf = TAKE(T);
	g->s1 = TAKE(mlp_floats(c, T));
	g->s2 = TAKE(mlp_floats(c, T));
	g->s3 = TAKE(mlp_floats(c, T));
	if (model_has_experts(c)) {
		g->moe_dy = TAKE(T * c->experts_per_tok * c->hidden_size);
		g->moe_dw = TAKE(T * c->experts_per_tok);
		g->moe_dz = TAKE(T * c->num_experts);
		g->moe_psum = TAKE(c->num_experts);
		g->moe_aux = TAKE(c->num_experts);
	}
	g->datt = TAKE(T * QD);
	g->dq = TAKE(T * QD);
	g->dk = TAKE(T * KD);
	g->dv = TAKE(T * KD);
	g->lm_cached = training && m->cap_lm_cache;
	if (!m->value_model) {
		g->logits = p;
		p += lm_logits_floats(m, T, g->lm_cached);
		g->lse = TAKE(T);
		g->ez = TAKE(T);
		g->stats = (struct logprob_stats *)TAKE(T * sizeof(struct logprob_stats) / sizeof(float));
	}
#undef TAKE
}

/* The logits tile of rows [r0, r0+R) x vocabulary [v0, v0+Vc): the
 * scratch tile, or its own place in the cache, where row block r0 takes
 * [R, V] at r0 V and its tiles lie one after the other ([R, Vc] at v0 R). */
static float *lm_tile_at(const struct llama_model *m, const struct global_acts *g,
			 int64_t r0, int64_t R, int64_t v0)
{
	return g->lm_cached ? g->logits + r0 * m->cfg.vocab_size + v0 * R : g->logits;
}

/* --- sticky-error wrappers over the kernel table ----------------------- */

/* out[T,nout] (beta) = in[T,nin] W[nout,nin]^T */
static void lin_fwd(struct llama_model *m, float *out, const float *in,
		    const float *W, int64_t T, int64_t nout, int64_t nin, float beta)
{
	if (!m->rc)
		m->rc = m->dev->k->gemm(m->dev, false, true, T, nout, nin, in, nin,
					W, nin, beta, out, nout);
}

/* din[T,nin] (beta) = dout[T,nout] W[nout,nin] */
static void lin_bwd_in(struct llama_model *m, float *din, const float *dout,
		       const float *W, int64_t T, int64_t nout, int64_t nin, float beta)
{
	if (!m->rc)
		m->rc = m->dev->k->gemm(m->dev, false, false, T, nin, nout, dout, nout,
					W, nin, beta, din, nin);
}

/* dW[nout,nin] += dout[T,nout]^T in[T,nin]; written, not added, when
 * `first` and the gradients are known zero (m->grads_zero): the product
 * then does not read the zeroes (beta 0). */
static void lin_bwd_w(struct llama_model *m, float *dW, const float *dout,
		      const float *in, int64_t T, int64_t nout, int64_t nin, bool first)
{
	if (!m->rc && !m->frozen)
		m->rc = m->dev->k->gemm(m->dev, true, false, nout, nin, T, dout, nout,
					in, nin, first && m->grads_zero ? 0.0f : 1.0f, dW, nin);
}

static void bias_add(struct llama_model *m, float *x, const float *b, int64_t R, int64_t N)
{
	if (!m->rc && b)
		m->rc = m->dev->k->bias_add(m->dev, x, b, R, N);
}

static void bias_bwd(struct llama_model *m, float *db, const float *dout, int64_t R, int64_t N)
{
	if (!m->rc && db && !m->frozen)
		m->rc = m->dev->k->bias_bwd(m->dev, db, dout, R, N);
}

static void norm_fwd(struct llama_model *m, float *out, float *rstd, const float *x,
		     const float *w, int64_t R, int64_t C)
{
	if (!m->rc)
		m->rc = m->dev->k->rmsnorm_fwd(m->dev, out, rstd, x, w, R, C,
					       (float)m->cfg.rms_norm_eps);
}

static void norm_bwd(struct llama_model *m, float *dx, float *dw, const float *dout,
		     const float *x, const float *w, const float *rstd, int64_t R,
		     int64_t C, float beta)
{
	if (!m->rc)
		m->rc = m->dev->k->rmsnorm_bwd(m->dev, dx, m->frozen ? NULL : dw, dout, x, w,
					       rstd, R, C, beta);
}

static void rope(struct llama_model *m, float *x, const int32_t *pos, int64_t T,
		 int64_t NH, bool inverse)
{
	if (!m->rc)
		m->rc = m->dev->k->rope(m->dev, x, pos, m->inv_freq, T, NH,
					m->cfg.head_dim, inverse);
}

static void copy(struct llama_model *m, float *dst, const float *src, int64_t n)
{
	if (!m->rc)
		m->rc = m->dev->ops->copy_d2d(m->dev, dst, src, n * sizeof(float));
}

static void scale(struct llama_model *m, float *x, float a, int64_t n)
{
	if (!m->rc)
		m->rc = m->dev->k->axpby(m->dev, x, a, x, 0.0f, n);
}

/* out[T,out] += scale (in[T,in] A^T) B^T for module `mod` of layer l, when
 * the pass's adapter targets it. */
static void lora_fwd(struct llama_model *m, int64_t l, int mod, float *out,
		     const float *in, int64_t T)
{
	const struct llama_lora *a = m->lora;
	int64_t nin, nout, r;

	if (!a || l < 0 || !a->layers[l].A[mod])
		return;
	r = a->rank;
	lora_module_dims(&m->cfg, mod, &nin, &nout);
	lin_fwd(m, a->scratch, in, a->layers[l].A[mod], T, r, nin, 0.0f);
	scale(m, a->scratch, a->scale, T * r);
	lin_fwd(m, out, a->scratch, a->layers[l].B[mod], T, nout, r, 1.0f);
}

/* The backward of lora_fwd, given dout[T,out] and the module's input
 * in[T,in]: dB += dout^T xa, dA += dxa^T in, din[T,in] += dxa A, with
 * xa = scale in A^T and dxa = scale dout B. Runs after the base's product
 * wrote din. */
static void lora_bwd(struct llama_model *m, int64_t l, int mod, const float *dout,
		     const float *in, float *din, int64_t T)
{
	const struct llama_lora *a = m->lora;
	const struct lora_layer *y;
	float *xa, *dxa, beta = m->grads_zero ? 0.0f : 1.0f;
	int64_t nin, nout, r;

	if (!a || l < 0 || !a->layers[l].A[mod])
		return;
	y = &a->layers[l];
	r = a->rank;
	xa = a->scratch;
	dxa = a->scratch + r * T;
	lora_module_dims(&m->cfg, mod, &nin, &nout);
	lin_fwd(m, xa, in, y->A[mod], T, r, nin, 0.0f);
	scale(m, xa, a->scale, T * r);
	if (!m->rc)
		m->rc = m->dev->k->gemm(m->dev, true, false, nout, r, T, dout, nout, xa, r,
					beta, y->dB[mod], r);
	lin_bwd_in(m, dxa, dout, y->B[mod], T, nout, r, 0.0f);
	scale(m, dxa, a->scale, T * r);
	if (!m->rc)
		m->rc = m->dev->k->gemm(m->dev, true, false, r, nin, T, dxa, r, in, nin,
					beta, y->dA[mod], nin);
	lin_bwd_in(m, din, dxa, y->A[mod], T, r, nin, 1.0f);
}

/* --- setup -------------------------------------------------------------- */

/* The experts' host memory (llama.h), freed and forgotten. */
static void moe_host_free(struct llama_model *m)
{
	free(m->moe_off);
	free(m->moe_host);
	free(m->moe_counts);
	free(m->moe_host_e);
	free(m->moe_groups);
	m->moe_off = NULL;
	m->moe_host = NULL;
	m->moe_counts = NULL;
	m->moe_host_e = NULL;
	m->moe_groups = NULL;
	m->moe_host_cap = 0;
}

int llama_init(struct llama_model *m, struct device *dev,
	       const struct model_config *cfg, bool value_model,
	       struct eng_error *err)
{
	int64_t half = cfg->head_dim / 2;
	float *host = malloc(half * sizeof(float));
	int rc;

	if (!host)
		return eng_fail(err, -ENOMEM, "rope: out of memory");
	/* a config made by hand, not parsed (model_config_parse checks these) */
	if (cfg->mlp == MODEL_MLP_MOE &&
	    (cfg->num_experts < 1 || cfg->num_experts > MODEL_MAX_EXPERTS ||
	     cfg->experts_per_tok < 1 || cfg->experts_per_tok > cfg->num_experts ||
	     cfg->experts_per_tok > MODEL_MAX_EXPERTS_PER_TOK || cfg->moe_intermediate_size < 1 ||
	     cfg->decoder_sparse_step < 1)) {
		free(host);
		return eng_fail(err, -EINVAL, "model: a mixture of experts needs 1 <= "
				"experts_per_tok (%lld) <= num_experts (%lld), "
				"moe_intermediate_size (%lld) and decoder_sparse_step (%lld) >= 1",
				(long long)cfg->experts_per_tok, (long long)cfg->num_experts,
				(long long)cfg->moe_intermediate_size,
				(long long)cfg->decoder_sparse_step);
	}
	m->moe_off = NULL;
	m->moe_host = NULL;
	m->moe_host_cap = 0;
	m->moe_counts = NULL;
	m->moe_host_e = NULL;
	m->moe_groups = NULL;
	m->moe_aux = m->moe_aux_scale = 0.0;
	if (model_has_experts(cfg)) {
		m->moe_off = calloc((size_t)(cfg->num_layers * (cfg->num_experts + 1)),
				    sizeof(*m->moe_off));
		m->moe_counts = calloc((size_t)cfg->num_experts, sizeof(*m->moe_counts));
		m->moe_host_e = calloc((size_t)cfg->num_experts, sizeof(*m->moe_host_e));
		m->moe_groups = calloc((size_t)cfg->num_experts, sizeof(*m->moe_groups));
		if (!m->moe_off || !m->moe_counts || !m->moe_host_e || !m->moe_groups) {
			free(host);
			moe_host_free(m);
			return eng_fail(err, -ENOMEM, "experts: out of memory");
		}
	}
	m->dev = dev;
	m->cfg = *cfg;
	m->value_model = value_model;
	m->lm_tile = LLAMA_LM_TILE_DEFAULT;
	m->lm_cache = LLAMA_LM_CACHE_DEFAULT;
	m->arena = NULL;
	m->arena_floats = 0;
	m->cap_tokens = 0;
	m->rc = 0;
	model_config_rope_inv_freq(cfg, host);
	m->inv_freq = dev->ops->alloc(dev, half * sizeof(float));
	if (!m->inv_freq) {
		free(host);
		moe_host_free(m);
		return eng_fail(err, -ENOMEM, "rope: out of device memory");
	}
	rc = dev->ops->copy_h2d(dev, m->inv_freq, host, half * sizeof(float));
	free(host);
	if (rc)
		return eng_fail(err, rc, "rope: copy to device failed");
	return 0;
}

void llama_release(struct llama_model *m)
{
	if (!m || !m->dev)
		return;
	llama_drop_activations(m);
	m->dev->ops->free(m->dev, m->inv_freq);
	m->inv_freq = NULL;
	moe_host_free(m);
}

void llama_drop_activations(struct llama_model *m)
{
	m->dev->ops->free(m->dev, m->arena);
	m->arena = NULL;
	m->arena_floats = 0;
	m->cap_tokens = 0;
	m->cap_training = false;
	m->cap_lm_cache = false;
}

/* --- forward ------------------------------------------------------------ */

/* The RMSNorms of a token's query (heads H) or key (KV) projection:
 * one per head (qwen3), or one over the whole projection (olmoe). */
static int64_t qk_norm_groups(const struct model_config *c, int64_t heads)
{
	return c->qk_norm == MODEL_QK_NORM_PROJ ? 1 : heads;
}

static void attention_block_fwd(struct llama_model *m, const struct llama_batch *b,
				int64_t l, const struct layer_weights *w, struct layer_acts *a)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size, H = c->num_heads, KV = c->num_kv_heads;
	int64_t D = c->head_dim, QD = H * D, KD = KV * D;
	float *q = c->qk_norm ? a->qpre : a->q, *k = c->qk_norm ? a->kpre : a->k;

	norm_fwd(m, a->ln1, a->rstd1, a->x, w->ln1, T, C);
	lin_fwd(m, q, a->ln1, w->wq, T, QD, C, 0.0f);
	bias_add(m, q, w->bq, T, QD);
	lora_fwd(m, l, LORA_Q, q, a->ln1, T);
	lin_fwd(m, k, a->ln1, w->wk, T, KD, C, 0.0f);
	bias_add(m, k, w->bk, T, KD);
	lora_fwd(m, l, LORA_K, k, a->ln1, T);
	lin_fwd(m, a->v, a->ln1, w->wv, T, KD, C, 0.0f);
	bias_add(m, a->v, w->bv, T, KD);
	lora_fwd(m, l, LORA_V, a->v, a->ln1, T);
	if (c->qk_norm) {
		int64_t hq = qk_norm_groups(c, H), hk = qk_norm_groups(c, KV);

		norm_fwd(m, a->q, a->qrstd, a->qpre, w->q_norm, T * hq, QD / hq);
		norm_fwd(m, a->k, a->krstd, a->kpre, w->k_norm, T * hk, KD / hk);
	}
	rope(m, a->q, b->pos, T, H, false);
	rope(m, a->k, b->pos, T, KV, false);
	if (b->kv && !m->rc)
		m->rc = m->dev->k->kv_write(m->dev, b->kv->k[l], b->kv->v[l], a->k, a->v,
					    b->kv->slots, T, KV, D);
	if (b->kv && !m->rc)
		m->rc = m->dev->k->attention_paged(m->dev, a->att, a->q, b->kv->k[l], b->kv->v[l],
						   b->kv->tables, b->kv->table_off, b->pos, T, H,
						   KV, D, b->kv->block, 1.0f / sqrtf((float)D));
	else if (!m->rc)
		m->rc = m->dev->k->attention_fwd(m->dev, a->att, a->lse, a->q, a->k, a->v,
						 b->cu_seqlens, b->B, T, H, KV, D,
						 1.0f / sqrtf((float)D));
	copy(m, a->xmid, a->x, T * C);
	lin_fwd(m, a->xmid, a->att, w->wo, T, C, QD, 1.0f);
	bias_add(m, a->xmid, w->bo, T, C);
	lora_fwd(m, l, LORA_O, a->xmid, a->att, T);
}

/* --- mixture of experts ------------------------------------------------ */

/* Layer l's index among the experts layers (a routing's layer, llama.h);
 * l = num_layers: their number. */
static int64_t experts_layer(const struct model_config *c, int64_t l)
{
	int64_t i = 0;

	for (int64_t j = 0; j < l; j++)
		i += model_layer_mlp(c, j) == MODEL_MLP_MOE;
	return i;
}

/* The T k choices in a->idx grouped by expert, in token order within an
 * expert: the experts' row ranges in m->moe_off (host: they size each
 * expert's products), each row's token (a->tok) and each choice's row
 * (a->pos). Through host memory: the device's choices come back once a
 * layer. */
static void moe_group(struct llama_model *m, const struct llama_batch *b, int64_t l,
		      struct layer_acts *a)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, E = c->num_experts, k = c->experts_per_tok, R = T * k;
	int64_t *off = m->moe_off + l * (E + 1);
	int32_t *idx = m->moe_host, *tok = idx + R, *pos = tok + R;

	if (m->rc)
		return;
	if (T > m->moe_host_cap) {
		m->rc = -EINVAL;   /* llama_reserve sizes the grouping's scratch */
		return;
	}
	m->rc = m->dev->ops->copy_d2h(m->dev, idx, a->idx, (size_t)R * sizeof(*idx));
	if (m->rc)
		return;
	if (b->route_out)
		memcpy(b->route_out + experts_layer(c, l) * R, idx, (size_t)R * sizeof(*idx));
	memset(off, 0, (size_t)(E + 1) * sizeof(*off));
	for (int64_t r = 0; r < R; r++)
		off[idx[r] + 1]++;      /* the router kernel's ids are in [0, E) */
	for (int64_t e = 0; e < E; e++)
		off[e + 1] += off[e];
	for (int64_t t = 0; t < T; t++)
		for (int64_t j = 0; j < k; j++) {
			int64_t e = idx[t * k + j], r;

			/* the next free row of expert e: rows so far, counted
			 * again from its start (a token picks an expert once) */
			r = off[e]++;
			tok[r] = (int32_t)t;
			pos[t * k + j] = (int32_t)r;
		}
	for (int64_t e = E; e > 0; e--)   /* off[e] moved to the end of e: shift back */
		off[e] = off[e - 1];
	off[0] = 0;
	m->rc = m->dev->ops->copy_h2d(m->dev, a->tok, tok, (size_t)R * sizeof(*tok));
	if (!m->rc)
		m->rc = m->dev->ops->copy_h2d(m->dev, a->pos, pos, (size_t)R * sizeof(*pos));
}

/* Projection j (0 gate, 1 up, 2 down) of every expert over its rows (off:
 * the layer's row ranges) as one grouped product (gemm_grouped), W_e
 * expert e's [wout, win] in w:
 *   EXPERTS_FWD     out[rows] = in[rows] W_e^T
 *   EXPERTS_BWD_IN  out[rows] (beta) = in[rows] W_e
 *   EXPERTS_BWD_W   W_e (beta) += out[rows]^T in[rows]  (w: the gradients;
 *                   out holds the output's gradient rows, read)
 */
enum experts_op { EXPERTS_FWD, EXPERTS_BWD_IN, EXPERTS_BWD_W };

static void experts_lin(struct llama_model *m, const int64_t *off, enum experts_op op, int j,
			float *w, float *out, const float *in, float beta)
{
	const struct model_config *c = &m->cfg;
	int64_t C = c->hidden_size, I = c->moe_intermediate_size, G = 0;
	int64_t wout = j == 2 ? C : I, win = j == 2 ? I : C;
	int64_t no = op == EXPERTS_BWD_IN ? win : wout, ni = op == EXPERTS_BWD_IN ? wout : win;
	bool bw = op == EXPERTS_BWD_W;

	if (m->rc || (bw && m->frozen))
		return;
	for (int64_t e = 0; e < c->num_experts; e++) {
		int64_t r0 = off[e], n = off[e + 1] - off[e];
		float *we = moe_expert_w(w, c, e, j);

		if (n)
			m->moe_groups[G++] = bw ?
				(struct gemm_group){.M = wout, .N = win, .K = n, .A = out + r0 * no,
						    .B = in + r0 * ni, .C = we} :
				(struct gemm_group){.M = n, .N = no, .K = ni, .A = in + r0 * ni,
						    .B = we, .C = out + r0 * no};
	}
	m->rc = m->dev->k->gemm_grouped(m->dev, bw, op == EXPERTS_FWD, G, m->moe_groups,
					bw ? wout : ni, win, beta, bw ? win : no);
}

/* A SwiGLU MLP, out (beta) = down(silu(x Wg^T) * (x Wu^T)) over T rows of
 * x [T,C] (a dense layer's MLP, or qwen2_moe's shared expert, F its
 * width): gate and up [T,F] kept for the backward, h [T,F] scratch. l: the
 * decoder layer whose adapter takes part (-1: none). */
static void swiglu_mlp_fwd(struct llama_model *m, int64_t l, int64_t T, int64_t F,
			   const float *wg, const float *wu, const float *wd, float *gate,
			   float *up, const float *x, float *h, float *out, float beta)
{
	int64_t C = m->cfg.hidden_size;

	lin_fwd(m, gate, x, wg, T, F, C, 0.0f);
	lora_fwd(m, l, LORA_GATE, gate, x, T);
	lin_fwd(m, up, x, wu, T, F, C, 0.0f);
	lora_fwd(m, l, LORA_UP, up, x, T);
	if (!m->rc)
		m->rc = m->dev->k->swiglu_fwd(m->dev, h, gate, up, T * F);
	lin_fwd(m, out, h, wd, T, C, F, beta);
	lora_fwd(m, l, LORA_DOWN, out, h, T);
}

/* Its backward from dy [T,C], the output's gradient: the weights'
 * gradients into gg, gu, gd, x's into dx (beta: 0 writes, 1 adds).
 * Scratch: g->s1..s3. */
static void swiglu_mlp_bwd(struct llama_model *m, int64_t l, int64_t T, int64_t F,
			   const float *wg, const float *wu, const float *wd, float *gg,
			   float *gu, float *gd, const float *gate, const float *up,
			   const float *x, const float *dy, float *dx, float beta,
			   struct global_acts *g)
{
	int64_t C = m->cfg.hidden_size;
	float *h = g->s1, *dh = g->s2, *dup = g->s3, *dgate = g->s1;

	if (!m->rc)
		m->rc = m->dev->k->swiglu_fwd(m->dev, h, gate, up, T * F);
	lin_bwd_w(m, gd, dy, h, T, C, F, true);
	lin_bwd_in(m, dh, dy, wd, T, C, F, 0.0f);
	lora_bwd(m, l, LORA_DOWN, dy, h, dh, T);
	if (!m->rc)
		m->rc = m->dev->k->swiglu_bwd(m->dev, dgate, dup, dh, gate, up, T * F);
	lin_bwd_w(m, gg, dgate, x, T, F, C, true);
	lin_bwd_w(m, gu, dup, x, T, F, C, true);
	lin_bwd_in(m, dx, dgate, wg, T, F, C, beta);
	lin_bwd_in(m, dx, dup, wu, T, F, C, 1.0f);
	lora_bwd(m, l, LORA_GATE, dgate, x, dx, T);
	lora_bwd(m, l, LORA_UP, dup, x, dx, T);
}

/* The shared expert's share of an experts layer (qwen2_moe), added to
 * x_out: sigmoid(ln2 . sh_score) SwiGLU_shared(ln2). h: [T,S] scratch. */
static void shared_expert_fwd(struct llama_model *m, int64_t T, const struct layer_weights *w,
			      struct layer_acts *a, float *h, float *x_out)
{
	const struct model_config *c = &m->cfg;
	int64_t C = c->hidden_size, S = c->shared_expert_size;

	swiglu_mlp_fwd(m, -1, T, S, w->sh_gate, w->sh_up, w->sh_down, a->sg, a->su, a->ln2, h,
		       a->sy, 0.0f);
	lin_fwd(m, a->sz, a->ln2, w->sh_score, T, 1, C, 0.0f);
	if (!m->rc)
		m->rc = m->dev->k->sigmoid_gate_fwd(m->dev, x_out, a->sz, a->sy, T, C);
}

/* Its backward, from g->dx (the layer output's gradient) into g->dln
 * (added) and the gradients gw; after experts_bwd, whose scratch it
 * reuses. */
static void shared_expert_bwd(struct llama_model *m, int64_t T, const struct layer_weights *w,
			      struct layer_weights *gw, const struct layer_acts *a,
			      struct global_acts *g)
{
	const struct model_config *c = &m->cfg;
	int64_t C = c->hidden_size, S = c->shared_expert_size;
	float *dy = g->moe_dy, *dz = g->moe_dz;

	if (!m->rc)
		m->rc = m->dev->k->sigmoid_gate_bwd(m->dev, dy, dz, g->dx, a->sz, a->sy, T, C);
	lin_bwd_w(m, gw->sh_score, dz, a->ln2, T, 1, C, true);
	lin_bwd_in(m, g->dln, dz, w->sh_score, T, 1, C, 1.0f);
	swiglu_mlp_bwd(m, -1, T, S, w->sh_gate, w->sh_up, w->sh_down, gw->sh_gate, gw->sh_up,
		       gw->sh_down, a->sg, a->su, a->ln2, dy, g->dln, 1.0f, g);
}

/* x_out = xmid + sum over the k chosen experts of w SwiGLU_e(ln2(xmid))
 * (+ the shared expert's share): the router's softmax and top-k (or the
 * batch's replayed choice, b->route), the rows grouped by expert, one
 * product per expert and projection over its rows, and the weighted sum
 * back in transformers' order (moe_combine). h: [R,I] scratch. */
static void experts_fwd(struct llama_model *m, const struct llama_batch *b, int64_t l,
			const struct layer_weights *w, struct layer_acts *a, float *h,
			float *x_out)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size, I = c->moe_intermediate_size;
	int64_t E = c->num_experts, k = c->experts_per_tok, R = T * k;
	const int64_t *off = m->moe_off + l * (E + 1);

	lin_fwd(m, a->probs, a->ln2, w->router, T, E, C, 0.0f);
	if (b->route && !m->rc)
		m->rc = m->dev->ops->copy_d2d(m->dev, a->idx, b->route + experts_layer(c, l) * R,
					      (size_t)R * sizeof(*a->idx));
	if (!m->rc)
		m->rc = m->dev->k->moe_route_fwd(m->dev, a->probs, a->idx, a->wts, T, E, k,
						 c->norm_topk_prob, b->route != NULL);
	moe_group(m, b, l, a);
	if (!m->rc)
		m->rc = m->dev->k->rows_gather(m->dev, a->xg, a->ln2, a->tok, R, C);
	experts_lin(m, off, EXPERTS_FWD, 0, w->experts, a->eg, a->xg, 0.0f);
	experts_lin(m, off, EXPERTS_FWD, 1, w->experts, a->eu, a->xg, 0.0f);
	if (!m->rc)
		m->rc = m->dev->k->swiglu_fwd(m->dev, h, a->eg, a->eu, R * I);
	experts_lin(m, off, EXPERTS_FWD, 2, w->experts, a->ey, h, 0.0f);
	if (!m->rc)
		m->rc = m->dev->k->moe_combine(m->dev, x_out, a->ey, a->pos, a->wts, T, k, C);
	if (c->shared_expert_size)
		shared_expert_fwd(m, T, w, a, h, x_out);
	if (!m->rc)   /* the residual added last, as transformers adds it */
		m->rc = m->dev->k->axpby(m->dev, x_out, 1.0f, a->xmid, 1.0f, T * C);
}

/* The backward of experts_fwd: dx (the layer output's gradient, also
 * the residual's) into g->dln (ln2's input gradient, through the experts
 * and the router); the weights' gradients into gw. */
static void experts_bwd(struct llama_model *m, int64_t l, int64_t T,
			const struct layer_weights *w, struct layer_weights *gw,
			struct layer_acts *a, struct global_acts *g)
{
	const struct model_config *c = &m->cfg;
	int64_t C = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts;
	int64_t k = c->experts_per_tok, R = T * k;
	const int64_t *off = m->moe_off + l * (E + 1);
	float *h = g->s1, *dh = g->s2, *dup = g->s3, *dgate = g->s1, *dy = g->moe_dy;
	float wbeta = m->grads_zero ? 0.0f : 1.0f;   /* the weight gradients, as lin_bwd_w */

	if (!m->rc)
		m->rc = m->dev->k->swiglu_fwd(m->dev, h, a->eg, a->eu, R * I);
	if (!m->rc)
		m->rc = m->dev->k->moe_combine_bwd(m->dev, dy, g->moe_dw, g->dx, a->ey, a->pos,
						   a->wts, T, k, C);
	experts_lin(m, off, EXPERTS_BWD_W, 2, gw->experts, dy, h, wbeta);
	experts_lin(m, off, EXPERTS_BWD_IN, 2, w->experts, dh, dy, 0.0f);
	if (!m->rc)
		m->rc = m->dev->k->swiglu_bwd(m->dev, dgate, dup, dh, a->eg, a->eu, R * I);
	/* dy, read, now holds the rows' dx */
	experts_lin(m, off, EXPERTS_BWD_W, 0, gw->experts, dgate, a->xg, wbeta);
	experts_lin(m, off, EXPERTS_BWD_W, 1, gw->experts, dup, a->xg, wbeta);
	experts_lin(m, off, EXPERTS_BWD_IN, 0, w->experts, dy, dgate, 0.0f);
	experts_lin(m, off, EXPERTS_BWD_IN, 1, w->experts, dy, dup, 1.0f);
	/* each token's rows summed back; then the router's share */
	if (!m->rc)
		m->rc = m->dev->k->moe_combine(m->dev, g->dln, dy, a->pos, NULL, T, k, C);
	if (!m->rc)
		m->rc = m->dev->k->moe_route_bwd(m->dev, g->moe_dz, g->moe_dw, a->probs, a->idx,
						 a->wts, m->moe_aux_scale != 0.0 ? g->moe_aux : NULL,
						 T, E, k, c->norm_topk_prob);
	lin_bwd_w(m, gw->router, g->moe_dz, a->ln2, T, E, C, true);
	lin_bwd_in(m, g->dln, g->moe_dz, w->router, T, E, C, 1.0f);
	if (c->shared_expert_size)
		shared_expert_bwd(m, T, w, gw, a, g);
}

/* The router's auxiliary loss of a forward over T tokens (llama.h):
 * transformers' load_balancing_loss_func over the N = T x (experts
 * layers) rows of every layer's router, E sum_e (count_e / N) (psum_e /
 * N), with count_e the rows' choices of e and psum_e its probabilities
 * summed (g->moe_psum, column sums taken as each layer ran). */
/* N: the rows of the auxiliary loss, T tokens through every experts layer. */
static double moe_aux_rows(const struct model_config *c, int64_t T)
{
	return (double)T * (double)experts_layer(c, c->num_layers);
}

static void moe_aux_finish(struct llama_model *m, int64_t T, const struct global_acts *g)
{
	const struct model_config *c = &m->cfg;
	int64_t E = c->num_experts;
	double sum = 0.0, N = moe_aux_rows(c, T);

	memset(m->moe_counts, 0, (size_t)E * sizeof(*m->moe_counts));
	for (int64_t l = 0; l < c->num_layers; l++) {
		const int64_t *off = m->moe_off + l * (E + 1);

		if (model_layer_mlp(c, l) != MODEL_MLP_MOE)
			continue;
		for (int64_t e = 0; e < E; e++)
			m->moe_counts[e] += off[e + 1] - off[e];
	}
	if (!m->rc)
		m->rc = m->dev->ops->copy_d2h(m->dev, m->moe_host_e, g->moe_psum,
					      (size_t)E * sizeof(float));
	for (int64_t e = 0; e < E && !m->rc; e++)
		sum += (double)m->moe_counts[e] * m->moe_host_e[e];
	m->moe_aux = m->rc || N == 0 ? 0.0 : (double)E * sum / (N * N);
}

/* The auxiliary loss's gradient of every row's probability of expert e,
 * moe_aux_scale E count_e / N^2, into g->moe_aux for the backward. */
static void moe_aux_grad(struct llama_model *m, int64_t T, const struct global_acts *g)
{
	const struct model_config *c = &m->cfg;
	int64_t E = c->num_experts;
	double N = moe_aux_rows(c, T);

	if (!m->moe_off || m->moe_aux_scale == 0.0 || m->rc)
		return;
	for (int64_t e = 0; e < E; e++)
		m->moe_host_e[e] = (float)(m->moe_aux_scale * (double)E *
					   (double)m->moe_counts[e] / (N * N));
	m->rc = m->dev->ops->copy_h2d(m->dev, g->moe_aux, m->moe_host_e, (size_t)E * sizeof(float));
}

static void mlp_block_fwd(struct llama_model *m, const struct llama_batch *b, int64_t l,
			  const struct layer_weights *w, struct layer_acts *a, float *h,
			  float *x_out)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size, F = c->intermediate_size;

	norm_fwd(m, a->ln2, a->rstd2, a->xmid, w->ln2, T, C);
	if (model_layer_mlp(c, l) == MODEL_MLP_MOE) {
		experts_fwd(m, b, l, w, a, h, x_out);
		return;
	}
	copy(m, x_out, a->xmid, T * C);   /* the residual, the MLP added to it */
	swiglu_mlp_fwd(m, l, T, F, w->w_gate, w->w_up, w->w_down, a->gate, a->up, a->ln2, h,
		       x_out, 1.0f);
}

/* row_logp/row_ent [T] through tiles of [rows, vocabulary chunk]; a
 * training pass with the cache leaves every tile in it for head_bwd. */
static void lm_head_fwd(struct llama_model *m, const struct llama_batch *b, float inv_temp,
			struct global_acts *g, float *row_logp, float *row_ent)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size, V = c->vocab_size;
	int64_t rows = lm_rows(m->lm_tile, T), cols = lm_cols(m->lm_tile, c, T);

	for (int64_t r0 = 0; r0 < T && !m->rc; r0 += rows) {
		int64_t R = T - r0 < rows ? T - r0 : rows;

		for (int64_t v0 = 0; v0 < V && !m->rc; v0 += cols) {
			int64_t Vc = V - v0 < cols ? V - v0 : cols;
			float *z = lm_tile_at(m, g, r0, R, v0);   /* [R, Vc] */

			lin_fwd(m, z, g->lnf + r0 * C, m->w.lm_head + v0 * C, R, Vc, C, 0.0f);
			if (!m->rc)
				m->rc = m->dev->k->logprob_chunk_fwd(m->dev, g->stats + r0, z,
								     b->targets + r0, R, v0, Vc,
								     inv_temp, v0 == 0);
		}
		if (!m->rc)
			m->rc = m->dev->k->logprob_chunk_finish(m->dev, row_logp + r0, row_ent + r0,
								g->lse + r0, g->ez + r0,
								g->stats + r0, b->targets + r0, R);
	}
}

/* The part hook (llama.h), once m->rc is clear: its error stops the pass. */
static void part(struct llama_model *m, int64_t p, bool backward, bool end)
{
	if (m->part && !m->rc)
		m->rc = m->part(m->part_ctx, p, backward, end);
}

int64_t llama_part_next(int64_t L, int64_t p, bool backward)
{
	/* forward: EMBED, 0 .. L-1, HEAD; backward: HEAD, L-1 .. 0, EMBED */
	if (!backward)
		return p < 0 ? LLAMA_PART_EMBED(L) : p == LLAMA_PART_EMBED(L) ? 0 :
		       p == LLAMA_PART_HEAD(L) ? -1 : p + 1 < L ? p + 1 : LLAMA_PART_HEAD(L);
	return p < 0 ? LLAMA_PART_HEAD(L) : p == LLAMA_PART_HEAD(L) ? L - 1 :
	       p == LLAMA_PART_EMBED(L) ? -1 : p > 0 ? p - 1 : LLAMA_PART_EMBED(L);
}

int llama_walk_parts(struct llama_model *m, bool backward)
{
	int64_t L = m->cfg.num_layers;

	m->rc = 0;
	for (int64_t p = llama_part_next(L, -1, backward); p >= 0;
	     p = llama_part_next(L, p, backward)) {
		part(m, p, backward, false);
		part(m, p, backward, true);
	}
	return m->rc;
}

int llama_forward(struct llama_model *m, const struct llama_batch *b,
		  float inv_temp, bool training, float *row_logp, float *row_ent,
		  float *row_val)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size, L = c->num_layers;
	struct global_acts g;
	struct layer_acts a;

	m->rc = 0;
	if (b->kv && training)
		return -EINVAL;   /* a cache is for decoding */
	if (T > m->cap_tokens || (training && !m->cap_training))
		return -EINVAL;   /* caller must llama_reserve first */
	global_acts_at(m, T, training, &g);
	layer_acts_at(m, T, 0, &a);
	if (!training)
		a.x = g.resid[0];
	if (m->moe_off && !m->rc)
		m->rc = m->dev->ops->memset0(m->dev, g.moe_psum, (size_t)c->num_experts *
					     sizeof(float));
	part(m, LLAMA_PART_EMBED(L), false, false);
	if (!m->rc)
		m->rc = m->dev->k->embedding_fwd(m->dev, a.x, m->w.wte, b->ids, T, C);
	part(m, LLAMA_PART_EMBED(L), false, true);
	for (int64_t l = 0; l < L; l++) {
		struct layer_acts next;
		float *x_out;

		if (l + 1 == L) {
			x_out = g.xL;
		} else if (training) {
			layer_acts_at(m, T, l + 1, &next);
			x_out = next.x;
		} else {
			x_out = g.resid[(l + 1) & 1];
		}
		part(m, l, false, false);
		attention_block_fwd(m, b, l, &m->w.layers[l], &a);
		mlp_block_fwd(m, b, l, &m->w.layers[l], &a, g.s1, x_out);
		if (model_layer_mlp(c, l) == MODEL_MLP_MOE && !m->rc)   /* for the aux loss */
			m->rc = m->dev->k->bias_bwd(m->dev, g.moe_psum, a.probs, T, c->num_experts);
		part(m, l, false, true);
		if (training && l + 1 < L)
			a = next;
		else
			a.x = x_out;
	}
	if (m->moe_off)
		moe_aux_finish(m, T, &g);
	part(m, LLAMA_PART_HEAD(L), false, false);
	norm_fwd(m, g.lnf, g.rstdf, g.xL, m->w.norm, T, C);
	if (m->value_model) {
		bool own = m->lora && m->lora->score;

		lin_fwd(m, row_val, g.lnf, own ? m->lora->score : m->w.score, T, 1, C, 0.0f);
		bias_add(m, row_val, own ? m->lora->score_bias : m->w.score_bias, T, 1);
	} else if (row_logp) {
		lm_head_fwd(m, b, inv_temp, &g, row_logp, row_ent);
	}
	part(m, LLAMA_PART_HEAD(L), false, true);
	return m->rc;
}

int llama_logits(struct llama_model *m, int64_t T, const int32_t *rows, int64_t R,
		 float *logits)
{
	int64_t C = m->cfg.hidden_size;
	struct global_acts g;

	if (m->value_model || R < 0 || R > T || T > m->cap_tokens)
		return -EINVAL;
	m->rc = 0;
	global_acts_at(m, T, false, &g);
	/* The rows gathered into the (free after the forward) dln buffer. */
	m->rc = m->dev->k->embedding_fwd(m->dev, g.dln, g.lnf, rows, R, C);
	lin_fwd(m, logits, g.dln, m->w.lm_head, R, m->cfg.vocab_size, C, 0.0f);
	return m->rc;
}

/* --- backward ----------------------------------------------------------- */

/* dlnf[T,C] = d(head)/d(lnf); accumulates head weight gradients. Each
 * logits tile (the forward's, or recomputed) becomes dlogits in place. */
static void head_bwd(struct llama_model *m, const struct llama_batch *b, float inv_temp,
		     struct global_acts *g, const float *drow_logp,
		     const float *drow_ent, const float *drow_val)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size, V = c->vocab_size;
	int64_t rows = lm_rows(m->lm_tile, T), cols = lm_cols(m->lm_tile, c, T);

	if (m->value_model) {
		/* row_val = lnf score^T + bias: dlnf = dval score; dscore += dval^T lnf
		 * (the adapter's own head when it has one, the base frozen) */
		const struct llama_lora *a = m->lora && m->lora->score ? m->lora : NULL;

		if (!m->rc)
			m->rc = m->dev->k->gemm(m->dev, false, false, T, C, 1, drow_val, 1,
						a ? a->score : m->w.score, C, 0.0f, g->dln, C);
		if (!m->rc && (a || !m->frozen))
			m->rc = m->dev->k->gemm(m->dev, true, false, 1, C, T, drow_val, 1,
						g->lnf, C, 1.0f, a ? a->dscore : m->g.score, C);
		if (!a)
			bias_bwd(m, m->g.score_bias, drow_val, T, 1);
		else if (!m->rc)
			m->rc = m->dev->k->bias_bwd(m->dev, a->dscore_bias, drow_val, T, 1);
		return;
	}
	for (int64_t r0 = 0; r0 < T && !m->rc; r0 += rows) {
		int64_t R = T - r0 < rows ? T - r0 : rows;

		for (int64_t v0 = 0; v0 < V && !m->rc; v0 += cols) {
			int64_t Vc = V - v0 < cols ? V - v0 : cols;
			const float *W = m->w.lm_head + v0 * C;
			float *z = lm_tile_at(m, g, r0, R, v0);   /* [R, Vc] */

			if (!g->lm_cached)
				lin_fwd(m, z, g->lnf + r0 * C, W, R, Vc, C, 0.0f);
			if (!m->rc)
				m->rc = m->dev->k->logprob_chunk_bwd(m->dev, z, b->targets + r0,
								     g->lse + r0, g->ez + r0,
								     drow_logp + r0, drow_ent + r0,
								     R, v0, Vc, inv_temp);
			lin_bwd_in(m, g->dln + r0 * C, z, W, R, Vc, C, v0 ? 1.0f : 0.0f);
			lin_bwd_w(m, m->frozen ? NULL : m->g.lm_head + v0 * C, z, g->lnf + r0 * C,
				  R, Vc, C,
				  r0 == 0);
		}
	}
}

/* g->dx holds dL/dx_{l+1} on entry and dL/dx_l on return. */
static void layer_bwd(struct llama_model *m, const struct llama_batch *b, int64_t l,
		      const struct layer_weights *w, struct layer_weights *gw,
		      struct layer_acts *a, struct global_acts *g)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size, F = c->intermediate_size;
	int64_t H = c->num_heads, KV = c->num_kv_heads, D = c->head_dim;
	int64_t QD = H * D, KD = KV * D;

	if (model_layer_mlp(c, l) == MODEL_MLP_MOE) {
		experts_bwd(m, l, T, w, gw, a, g);
		goto mlp_done;
	}
	/* MLP: x_{l+1} = xmid + h Wd^T; dxmid starts as dx (same buffer). */
	swiglu_mlp_bwd(m, l, T, F, w->w_gate, w->w_up, w->w_down, gw->w_gate, gw->w_up,
		       gw->w_down, a->gate, a->up, a->ln2, g->dx, g->dln, 0.0f, g);
mlp_done:
	norm_bwd(m, g->dx, gw->ln2, g->dln, a->xmid, w->ln2, a->rstd2, T, C, 1.0f);

	/* Attention: xmid = x_l + att Wo^T (+ bo). */
	bias_bwd(m, gw->bo, g->dx, T, C);
	lin_bwd_w(m, gw->wo, g->dx, a->att, T, C, QD, true);
	lin_bwd_in(m, g->datt, g->dx, w->wo, T, C, QD, 0.0f);
	lora_bwd(m, l, LORA_O, g->dx, a->att, g->datt, T);
	if (!m->rc)
		m->rc = m->dev->k->attention_bwd(m->dev, g->dq, g->dk, g->dv, g->datt,
						 a->q, a->k, a->v, a->att, a->lse,
						 b->cu_seqlens, b->B, T, H, KV, D,
						 1.0f / sqrtf((float)D));
	rope(m, g->dq, b->pos, T, H, true);
	rope(m, g->dk, b->pos, T, KV, true);
	if (c->qk_norm) {
		int64_t hq = qk_norm_groups(c, H), hk = qk_norm_groups(c, KV);

		/* dq/dk w.r.t. the pre-norm projections, through scratch. */
		norm_bwd(m, g->datt, gw->q_norm, g->dq, a->qpre, w->q_norm, a->qrstd,
			 T * hq, QD / hq, 0.0f);
		copy(m, g->dq, g->datt, T * QD);
		norm_bwd(m, g->datt, gw->k_norm, g->dk, a->kpre, w->k_norm, a->krstd,
			 T * hk, KD / hk, 0.0f);
		copy(m, g->dk, g->datt, T * KD);
	}
	bias_bwd(m, gw->bq, g->dq, T, QD);
	bias_bwd(m, gw->bk, g->dk, T, KD);
	bias_bwd(m, gw->bv, g->dv, T, KD);
	lin_bwd_w(m, gw->wq, g->dq, a->ln1, T, QD, C, true);
	lin_bwd_w(m, gw->wk, g->dk, a->ln1, T, KD, C, true);
	lin_bwd_w(m, gw->wv, g->dv, a->ln1, T, KD, C, true);
	lin_bwd_in(m, g->dln, g->dq, w->wq, T, QD, C, 0.0f);
	lin_bwd_in(m, g->dln, g->dk, w->wk, T, KD, C, 1.0f);
	lin_bwd_in(m, g->dln, g->dv, w->wv, T, KD, C, 1.0f);
	lora_bwd(m, l, LORA_Q, g->dq, a->ln1, g->dln, T);
	lora_bwd(m, l, LORA_K, g->dk, a->ln1, g->dln, T);
	lora_bwd(m, l, LORA_V, g->dv, a->ln1, g->dln, T);
	norm_bwd(m, g->dx, gw->ln1, g->dln, a->x, w->ln1, a->rstd1, T, C, 1.0f);
}

int llama_backward(struct llama_model *m, const struct llama_batch *b,
		   float inv_temp, const float *drow_logp, const float *drow_ent,
		   const float *drow_val)
{
	const struct model_config *c = &m->cfg;
	int64_t T = b->T, C = c->hidden_size;
	struct global_acts g;

	m->rc = 0;
	if (!m->cap_training || T > m->cap_tokens)
		return -EINVAL;
	global_acts_at(m, T, true, &g);
	moe_aux_grad(m, T, &g);
	part(m, LLAMA_PART_HEAD(c->num_layers), true, false);
	head_bwd(m, b, inv_temp, &g, drow_logp, drow_ent, drow_val);
	norm_bwd(m, g.dx, m->g.norm, g.dln, g.xL, m->w.norm, g.rstdf, T, C, 0.0f);
	part(m, LLAMA_PART_HEAD(c->num_layers), true, true);
	if (m->grads_done && !m->rc)
		m->grads_done(m->grads_done_ctx, c->num_layers);
	for (int64_t l = c->num_layers - 1; l >= 0; l--) {
		struct layer_acts a;

		layer_acts_at(m, T, l, &a);
		part(m, l, true, false);
		if (m->cap_recompute) {
			/* The layer's forward again from its kept input, with the
			 * same kernels on the same data: the same activations, so
			 * the same gradients. Its output goes to scratch. */
			attention_block_fwd(m, b, l, &m->w.layers[l], &a);
			mlp_block_fwd(m, b, l, &m->w.layers[l], &a, g.s1, g.resid[0]);
		}
		layer_bwd(m, b, l, &m->w.layers[l], &m->g.layers[l], &a, &g);
		part(m, l, true, true);
		if (m->grads_done && !m->rc)
			m->grads_done(m->grads_done_ctx, l);
	}
	part(m, LLAMA_PART_EMBED(c->num_layers), true, false);
	if (!m->rc && !m->frozen)
		m->rc = m->dev->k->embedding_bwd(m->dev, m->g.wte, g.dx, b->ids, T, C,
						 c->vocab_size, c->pad_token_id);
	part(m, LLAMA_PART_EMBED(c->num_layers), true, true);
	m->grads_zero = false;
	return m->rc;
}
