/* params.c — parameter table of the Llama family (see params.h). */
#include "params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"

struct table_builder {
	struct param_table *t;
	int64_t cap;
	int64_t layer;        /* of the entries added now; -1: none */
	int rc;
};

int param_table_append(struct param_table *t, int64_t *cap, const char *name, int ndim,
		       int64_t d0, int64_t d1, int64_t layer)
{
	struct param_entry *e;

	if (t->count >= MODEL_MAX_TENSORS)
		return -EMSGSIZE;
	if (t->count == *cap) {
		int64_t c = *cap ? 2 * *cap : 64;
		struct param_entry *n = realloc(t->entries, c * sizeof(*n));

		if (!n)
			return -ENOMEM;
		t->entries = n;
		*cap = c;
	}
	e = &t->entries[t->count++];
	memset(e, 0, sizeof(*e));
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->ndim = ndim;
	e->shape[0] = d0;
	e->shape[1] = ndim > 1 ? d1 : 1;
	e->offset = t->total;
	e->layer = layer;
	e->role = PARAM_TRAINABLE;
	/* Dimensions are bounded (config.h) but the sum over the layers is
	 * checked all the same. */
	if (!ck_mul_i64(d0, ndim > 1 ? d1 : 1, &e->numel) ||
	    !ck_add_i64(t->total, e->numel, &t->total))
		return -E2BIG;
	e->held_start = 0;      /* the whole tensor */
	e->held_numel = e->numel;
	return 0;
}

static void add(struct table_builder *b, const char *name, int ndim, int64_t d0,
		int64_t d1, bool ones, bool zero)
{
	if (b->rc)
		return;
	b->rc = param_table_append(b->t, &b->cap, name, ndim, d0, d1, b->layer);
	if (!b->rc) {
		b->t->entries[b->t->count - 1].init_ones = ones;
		b->t->entries[b->t->count - 1].init_zero = zero;
	}
}

/* Hugging Face's names of a layer's router and of expert e's projection
 * j (0 gate, 1 up, 2 down): qwen3_moe's mlp.experts.N.gate_proj, mixtral's
 * block_sparse_moe.experts.N.w1 (gate), w3 (up), w2 (down). */
static void router_name(const struct model_config *c, int64_t l, char *n, size_t size)
{
	snprintf(n, size, "model.layers.%lld.%s.gate.weight", (long long)l,
		 c->arch == ARCH_MIXTRAL ? "block_sparse_moe" : "mlp");
}

static const char *const expert_proj[2][3] = {
	{"gate_proj", "up_proj", "down_proj"},   /* qwen3_moe */
	{"w1", "w3", "w2"},                      /* mixtral */
};

static void expert_name(const struct model_config *c, int64_t l, int64_t e, int j, char *n,
			size_t size)
{
	bool mx = c->arch == ARCH_MIXTRAL;

	snprintf(n, size, "model.layers.%lld.%s.experts.%lld.%s.weight", (long long)l,
		 mx ? "block_sparse_moe" : "mlp", (long long)e, expert_proj[mx][j]);
}

bool param_expert_of(const struct model_config *c, const char *name, int64_t *ret_l,
		     int64_t *ret_e, int *ret_j)
{
	long long l, e;
	char proj[16], back[96];

	if (sscanf(name, "model.layers.%lld.%*[a-z_].experts.%lld.%15[a-z0-9_].weight", &l, &e,
		   proj) != 3 || l < 0 || l >= c->num_layers || e < 0 || e >= c->num_experts)
		return false;
	for (int j = 0; j < 3; j++) {
		expert_name(c, l, e, j, back, sizeof(back));
		if (!strcmp(back, name)) {
			*ret_l = l;
			*ret_e = e;
			*ret_j = j;
			return true;
		}
	}
	return false;
}

/* qwen2_moe's shared expert: projection j (0 gate, 1 up, 2 down) and,
 * j == 3, its sigmoid gate [1, C]. */
static void shared_expert_name(int64_t l, int j, char *n, size_t size)
{
	static const char *const part[4] = {
		"shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj",
		"shared_expert_gate",
	};

	snprintf(n, size, "model.layers.%lld.mlp.%s.weight", (long long)l, part[j]);
}

/* A mixture-of-experts layer's router and experts, in moe_expert_w's
 * order (params.h), then its shared expert if the family has one. */
static void add_experts(struct table_builder *b, const struct model_config *c, int64_t l)
{
	int64_t C = c->hidden_size, I = c->moe_intermediate_size, S = c->shared_expert_size;
	char n[96];

	router_name(c, l, n, sizeof(n));
	add(b, n, 2, c->num_experts, C, false, false);
	for (int64_t e = 0; e < c->num_experts; e++)
		for (int j = 0; j < 3; j++) {
			expert_name(c, l, e, j, n, sizeof(n));
			add(b, n, 2, j == 2 ? C : I, j == 2 ? I : C, false, false);
		}
	for (int j = 0; S && j < 4; j++) {
		shared_expert_name(l, j, n, sizeof(n));
		add(b, n, 2, j == 2 ? C : j == 3 ? 1 : S, j == 2 ? S : C, false, false);
	}
}

int param_table_build(const struct model_config *cfg, bool value_model,
		      struct param_table *ret, struct eng_error *err)
{
	struct param_table t = {0};
	struct table_builder b = {.t = &t, .layer = -1};
	int64_t C = cfg->hidden_size, F = cfg->intermediate_size;
	int64_t QD = cfg->num_heads * cfg->head_dim;
	int64_t KD = cfg->num_kv_heads * cfg->head_dim;
	char n[96];

	add(&b, "model.embed_tokens.weight", 2, cfg->vocab_size, C, false, false);
	for (int64_t l = 0; l < cfg->num_layers; l++) {
		b.layer = l;
#define P(suffix) (snprintf(n, sizeof(n), "model.layers.%lld." suffix, (long long)l), n)
		add(&b, P("input_layernorm.weight"), 1, C, 0, true, false);
		add(&b, P("self_attn.q_proj.weight"), 2, QD, C, false, false);
		if (cfg->attention_bias)
			add(&b, P("self_attn.q_proj.bias"), 1, QD, 0, false, true);
		add(&b, P("self_attn.k_proj.weight"), 2, KD, C, false, false);
		if (cfg->attention_bias)
			add(&b, P("self_attn.k_proj.bias"), 1, KD, 0, false, true);
		add(&b, P("self_attn.v_proj.weight"), 2, KD, C, false, false);
		if (cfg->attention_bias)
			add(&b, P("self_attn.v_proj.bias"), 1, KD, 0, false, true);
		if (cfg->qk_norm) {
			bool proj = cfg->qk_norm == MODEL_QK_NORM_PROJ;

			add(&b, P("self_attn.q_norm.weight"), 1, proj ? QD : cfg->head_dim, 0, true,
			    false);
			add(&b, P("self_attn.k_norm.weight"), 1, proj ? KD : cfg->head_dim, 0, true,
			    false);
		}
		add(&b, P("self_attn.o_proj.weight"), 2, C, QD, false, false);
		if (cfg->o_proj_bias)
			add(&b, P("self_attn.o_proj.bias"), 1, C, 0, false, true);
		add(&b, P("post_attention_layernorm.weight"), 1, C, 0, true, false);
		if (model_layer_mlp(cfg, l) == MODEL_MLP_MOE) {
			add_experts(&b, cfg, l);
			continue;
		}
		add(&b, P("mlp.gate_proj.weight"), 2, F, C, false, false);
		add(&b, P("mlp.up_proj.weight"), 2, F, C, false, false);
		add(&b, P("mlp.down_proj.weight"), 2, C, F, false, false);
#undef P
	}
	b.layer = -1;
	add(&b, "model.norm.weight", 1, C, 0, true, false);
	if (value_model) {
		add(&b, "score.weight", 2, 1, C, false, false);
		add(&b, "score.bias", 1, 1, 0, false, true);
	} else if (!cfg->tie_word_embeddings) {
		add(&b, "lm_head.weight", 2, cfg->vocab_size, C, false, false);
	}
	if (b.rc) {
		free(t.entries);
		return eng_fail(err, b.rc == -EMSGSIZE ? -E2BIG : b.rc,
				b.rc == -E2BIG ? "parameter table: the model's size overflows" :
				b.rc == -EMSGSIZE ? "parameter table: more than %lld tensors "
				"(num_hidden_layers x (num_experts x 3 + 9))" :
				"parameter table: out of memory", (long long)MODEL_MAX_TENSORS);
	}
	*ret = t;
	return 0;
}

void param_table_free(struct param_table *t)
{
	if (!t)
		return;
	free(t->entries);
	memset(t, 0, sizeof(*t));
}

int64_t param_table_find(const struct param_table *t, const char *name)
{
	for (int64_t i = 0; i < t->count; i++)
		if (!strcmp(t->entries[i].name, name))
			return i;
	return -1;
}

bool param_table_tied(const struct param_table *t)
{
	return param_table_find(t, "lm_head.weight") < 0 && param_table_find(t, "score.weight") < 0;
}

/* The entries [from, to) of the table a binding searches: a layer's
 * own (they are contiguous), so that binding stays linear in the table's
 * size however many layers and experts it has. */
struct window {
	int64_t from, to;
};

static int64_t find_in(const struct param_table *t, struct window w, const char *name)
{
	for (int64_t i = w.from; i < w.to; i++)
		if (!strcmp(t->entries[i].name, name))
			return i;
	return -1;
}

/* Point *slot at tensor `name` (searched in w) in base, which holds the
 * table's elements [lo, hi), when the tensor lies there; else leave *slot
 * (NULL when the model has no such tensor and the whole table is bound). */
static void at(const struct param_table *t, struct window w, float *base, int64_t lo,
	       int64_t hi, const char *name, float **slot)
{
	int64_t i = find_in(t, w, name);

	if (i < 0) {
		if (lo == 0 && hi == t->total)
			*slot = NULL;
		return;
	}
	if (t->entries[i].offset >= lo && t->entries[i].offset + t->entries[i].numel <= hi)
		*slot = base + (t->entries[i].offset - lo);
}

/* at() for `numel` elements from tensor `name` on (a run of tensors). */
static void at_block(const struct param_table *t, struct window w, float *base, int64_t lo,
		     int64_t hi, const char *name, int64_t numel, float **slot)
{
	int64_t i = find_in(t, w, name);

	if (i >= 0 && t->entries[i].offset >= lo && t->entries[i].offset + numel <= hi)
		*slot = base + (t->entries[i].offset - lo);
}

void model_weights_bind(const struct param_table *t, const struct model_config *cfg,
			float *base, struct model_weights *ret)
{
	model_weights_bind_range(t, cfg, base, 0, t->total, ret);
}

void model_weights_bind_range(const struct param_table *t, const struct model_config *cfg,
			      float *base, int64_t lo, int64_t hi, struct model_weights *ret)
{
	bool tied = param_table_tied(t);
	struct window all = {0, t->count}, win = {0, 0};
	char n[96];

	at(t, all, base, lo, hi, "model.embed_tokens.weight", &ret->wte);
	at(t, all, base, lo, hi, "model.norm.weight", &ret->norm);
	at(t, all, base, lo, hi, "score.weight", &ret->score);
	at(t, all, base, lo, hi, "score.bias", &ret->score_bias);
	at(t, all, base, lo, hi, "lm_head.weight", &ret->lm_head);
	if (tied)
		ret->lm_head = ret->wte;
	for (int64_t l = 0; l < cfg->num_layers; l++) {
		struct layer_weights *w = &ret->layers[l];

		/* layer l's entries: from where layer l - 1's ended */
		while (win.from < t->count && t->entries[win.from].layer != l)
			win.from++;
		for (win.to = win.from; win.to < t->count && t->entries[win.to].layer == l;)
			win.to++;
#define G(suffix, f) (snprintf(n, sizeof(n), "model.layers.%lld." suffix, (long long)l), \
		      at(t, win, base, lo, hi, n, &w->f))
		G("input_layernorm.weight", ln1);
		G("self_attn.q_proj.weight", wq);
		G("self_attn.q_proj.bias", bq);
		G("self_attn.k_proj.weight", wk);
		G("self_attn.k_proj.bias", bk);
		G("self_attn.v_proj.weight", wv);
		G("self_attn.v_proj.bias", bv);
		G("self_attn.q_norm.weight", q_norm);
		G("self_attn.k_norm.weight", k_norm);
		G("self_attn.o_proj.weight", wo);
		G("self_attn.o_proj.bias", bo);
		G("post_attention_layernorm.weight", ln2);
		G("mlp.gate_proj.weight", w_gate);
		G("mlp.up_proj.weight", w_up);
		G("mlp.down_proj.weight", w_down);
#undef G
		if (model_layer_mlp(cfg, l) != MODEL_MLP_MOE) {
			if (lo == 0 && hi == t->total)
				w->router = w->experts = w->sh_gate = w->sh_up = w->sh_down =
					w->sh_score = NULL;
			continue;
		}
		router_name(cfg, l, n, sizeof(n));
		at(t, win, base, lo, hi, n, &w->router);
		for (int j = 0; j < 4; j++) {
			float **shared[4] = {&w->sh_gate, &w->sh_up, &w->sh_down, &w->sh_score};

			shared_expert_name(l, j, n, sizeof(n));
			at(t, win, base, lo, hi, n, shared[j]);
		}
		/* the experts: one block, bound where all of it lies in range */
		expert_name(cfg, l, 0, 0, n, sizeof(n));
		at_block(t, win, base, lo, hi, n, 3 * cfg->num_experts *
			 cfg->moe_intermediate_size * cfg->hidden_size, &w->experts);
	}
}
