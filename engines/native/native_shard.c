/* native_shard.c — ZeRO-2 and ZeRO-3 in a data-parallel group
 * (dist.zero_stage; docs/DISTRIBUTED.md): the gradients (2) and the
 * parameters too (3) are held as this rank's slice of the flat table,
 * the same slice [shard_off, shard_off + shard_len) as ZeRO-1's AdamW
 * moments, so the step, the norm and the optimizer files are ZeRO-1's.
 *
 * A pass works on the model part by part (llama.h's part hooks: the
 * embedding, each layer, the head), each a contiguous range [lo, hi) of
 * the table that the ranks' slices cut into at most a few pieces:
 *   - ZeRO-3, before a part is used: its weights gathered into a buffer of
 *     the part's size, each piece broadcast from the rank that holds it
 *     (a layer into one of two slots, layer l into slot l % 2; the head
 *     and the embedding into buffers of their own). A buffer still holding
 *     the part since the last step is used as it is (the last layers of a
 *     forward serve the backward that follows; the head and the embedding
 *     serve every micro-batch);
 *   - ZeRO-2 and 3, in a backward: the part's gradients go into a scratch
 *     buffer of its size, zeroed first; when the part is done each piece
 *     is reduced (summed) to the rank that holds it, which adds the sum to
 *     its slice of the gradients.
 * A tied head reads the embedding's buffer and writes the embedding's
 * gradient scratch, which is reduced after the embedding's backward.
 * The collectives run on the engine's thread, one part after another
 * (no overlap with compute yet), and every rank must run the same passes:
 * ForwardBackward agrees the number of micro-batches first and a rank
 * with fewer walks the parts of the missing ones (llama_walk_parts),
 * adding zero gradients.
 */
#include "native_engine.h"

#include <stdlib.h>
#include <string.h>

/* Buffer indices: weights (ZeRO-3) and gradient scratch. */
enum { W_SLOT0, W_SLOT1, W_HEAD, W_EMBED, W_COUNT };
enum { G_LAYER, G_HEAD, G_EMBED, G_COUNT };

struct native_shard {
	int stage;
	int64_t L;
	bool tied;                  /* the head reads the embedding */
	int64_t (*range)[2];        /* [L + 2]: parts' [lo, hi) of the table */
	float *w[W_COUNT];          /* ZeRO-3 only */
	int64_t held[W_COUNT];      /* the part a weight buffer holds, or -1 */
	float *g[G_COUNT];
	size_t bytes;               /* of w[] and g[] */
	/* ZeRO-3: the last tensor a reader gathered (native_shard_tensor),
	 * kept until the parameters change; index -1: none. */
	float *tensor;
	int64_t tensor_i;
};

static int64_t part_of(const struct param_entry *e, int64_t L)
{
	if (e->layer >= 0)
		return e->layer;
	return strcmp(e->name, "model.embed_tokens.weight") ? LLAMA_PART_HEAD(L)
							     : LLAMA_PART_EMBED(L);
}

static int w_index(const struct native_shard *s, int64_t p)
{
	return p == LLAMA_PART_HEAD(s->L) ? W_HEAD : p == LLAMA_PART_EMBED(s->L) ? W_EMBED
										  : (int)(p & 1);
}

static int g_index(const struct native_shard *s, int64_t p)
{
	return p == LLAMA_PART_HEAD(s->L) ? G_HEAD : p == LLAMA_PART_EMBED(s->L) ? G_EMBED
										  : G_LAYER;
}

static int64_t part_len(const struct native_shard *s, int64_t p)
{
	return s->range[p][1] - s->range[p][0];
}

bool native_shard_params(const struct native *n)
{
	return n->group.zero_stage == 3;
}

bool native_shard_grads(const struct native *n)
{
	return n->group.zero_stage >= 2;
}

int native_shard_stage(const struct native *n)
{
	return n->group.zero_stage;
}

size_t native_shard_bytes(const struct native *n)
{
	return n->group.shard ? n->group.shard->bytes : 0;
}

/* The part ranges from the table: every tensor belongs to one part and
 * each part's tensors lie end to end. */
static int shard_ranges(struct native *n, struct native_shard *s, struct eng_error *err)
{
	int64_t parts = s->L + 2, sum;

	s->range = malloc((size_t)parts * sizeof(*s->range));
	if (!s->range)
		return eng_fail(err, -ENOMEM, "dist: out of memory");
	for (int64_t p = 0; p < parts; p++) {
		s->range[p][0] = n->table.total;
		s->range[p][1] = 0;
	}
	for (int64_t i = 0; i < n->table.count; i++) {
		const struct param_entry *e = &n->table.entries[i];
		int64_t p = part_of(e, s->L);

		if (e->offset < s->range[p][0])
			s->range[p][0] = e->offset;
		if (e->offset + e->numel > s->range[p][1])
			s->range[p][1] = e->offset + e->numel;
	}
	for (int64_t p = 0; p < parts; p++) {
		sum = 0;
		for (int64_t i = 0; i < n->table.count; i++)
			if (part_of(&n->table.entries[i], s->L) == p)
				sum += n->table.entries[i].numel;
		if (sum != part_len(s, p))
			return eng_fail(err, -EINVAL, "dist.zero_stage: part %lld of the model is "
					"not contiguous in its parameter table", (long long)p);
	}
	return 0;
}

static int shard_alloc(struct native *n, struct native_shard *s, struct eng_error *err)
{
	int64_t layer = 0, len[W_COUNT];

	for (int64_t l = 0; l < s->L; l++)
		if (part_len(s, l) > layer)
			layer = part_len(s, l);
	len[W_SLOT0] = len[W_SLOT1] = layer;
	len[W_HEAD] = part_len(s, LLAMA_PART_HEAD(s->L));
	len[W_EMBED] = part_len(s, LLAMA_PART_EMBED(s->L));
	for (int i = 0; i < W_COUNT; i++) {
		s->held[i] = -1;
		if (s->stage < 3)
			continue;
		s->w[i] = native_dalloc(n, (size_t)len[i] * sizeof(float));
		if (!s->w[i])
			return eng_fail(err, -ENOMEM, "dist.zero_stage 3: out of memory for the "
					"gathered layers (%lld floats)", (long long)len[i]);
		s->bytes += (size_t)len[i] * sizeof(float);
	}
	for (int i = 0; i < G_COUNT; i++) {
		int64_t gl = len[i == G_LAYER ? W_SLOT0 : i == G_HEAD ? W_HEAD : W_EMBED];

		s->g[i] = native_dalloc(n, (size_t)gl * sizeof(float));
		if (!s->g[i])
			return eng_fail(err, -ENOMEM, "dist.zero_stage: out of memory for the "
					"gradient buffers (%lld floats)", (long long)gl);
		s->bytes += (size_t)gl * sizeof(float);
	}
	return 0;
}

void native_shard_free(struct native *n)
{
	struct native_shard *s = n->group.shard;

	if (!s)
		return;
	for (int i = 0; i < W_COUNT; i++)
		native_dfree(n, s->w[i]);
	for (int i = 0; i < G_COUNT; i++)
		native_dfree(n, s->g[i]);
	native_dfree(n, s->tensor);
	free(s->range);
	free(s);
	n->group.shard = NULL;
	n->model.part = NULL;
}

void native_shard_invalidate(struct native *n)
{
	struct native_shard *s = n->group.shard;

	if (!s)
		return;
	for (int i = 0; i < W_COUNT; i++)
		s->held[i] = -1;
	native_dfree(n, s->tensor);
	s->tensor = NULL;
	s->tensor_i = -1;
}

int native_shard_tensor(struct native *n, int64_t i, const float **ret, struct eng_error *err)
{
	struct native_shard *s = n->group.shard;
	const struct param_entry *p = &n->table.entries[i];
	int rc;

	if (s->tensor_i != i) {
		native_dfree(n, s->tensor);
		s->tensor_i = -1;
		s->tensor = native_dalloc(n, (size_t)p->numel * sizeof(float));
		if (!s->tensor)
			return eng_fail(err, -ENOMEM, "%s: out of memory to gather it (%lld floats)",
					p->name, (long long)p->numel);
		rc = native_shard_gather(n, s->tensor, p->offset, p->offset + p->numel, err);
		if (rc)
			return rc;
		s->tensor_i = i;
	}
	*ret = s->tensor;
	return 0;
}

/* This rank's slice of family f (the slice of a whole family, or the
 * family itself when it holds the slice only). */
float *native_slice(struct native *n, enum native_fam f)
{
	float *p = n->fam[f].dev ? n->fam[f].dev : n->fam[f].host;

	return native_family_len(n, f) == n->group.padded_total ? p + n->group.shard_off : p;
}

/* The pieces of [lo, hi) that the ranks' slices cut it into: rank r holds
 * [r S, (r + 1) S). */
#define FOR_PIECES(n, lo, hi, r, a, b)                                                  \
	for (int64_t r = (lo) / (n)->group.shard_len, a, b;                              \
	     r * (n)->group.shard_len < (hi) &&                                           \
	     (a = (lo) > r * (n)->group.shard_len ? (lo) : r * (n)->group.shard_len,     \
	      b = (hi) < (r + 1) * (n)->group.shard_len ? (hi)                           \
							: (r + 1) * (n)->group.shard_len, 1); \
	     r++)

int native_shard_gather(struct native *n, float *buf, int64_t lo, int64_t hi,
			struct eng_error *err)
{
	struct dist *d = n->group.dist;
	const struct device_ops *o = n->dev->ops;
	const float *mine = native_slice(n, FAM_PARAMS);
	int rc = 0;

	FOR_PIECES(n, lo, hi, r, a, b) {
		if (r == d->rank)
			rc = o->copy_d2d(n->dev, buf + (a - lo), mine + (a - n->group.shard_off),
					 (size_t)(b - a) * sizeof(float));
		if (rc == 0)
			rc = o->sync(n->dev);
		if (rc == 0)
			rc = d->ops->broadcast(d, buf + (a - lo), b - a, DIST_F32, (int)r, err);
		if (rc)
			break;
	}
	return rc < 0 && !err->code ? eng_fail(err, rc, "dist: gathering parameters failed")
				    : rc;
}

/* Each piece of buf (the gradients of [lo, hi)) summed to its holder,
 * which adds the sum to its slice of the gradients. */
static int reduce_range(struct native *n, float *buf, int64_t lo, int64_t hi,
			struct eng_error *err)
{
	struct dist *d = n->group.dist;
	float *mine = native_slice(n, FAM_GRADS);
	int rc = n->dev->ops->sync(n->dev);

	FOR_PIECES(n, lo, hi, r, a, b) {
		if (rc == 0)
			rc = d->ops->reduce(d, buf + (a - lo), b - a, DIST_F32, (int)r, NULL, err);
		if (rc == 0 && r == d->rank)
			rc = n->dev->k->axpby(n->dev, mine + (a - n->group.shard_off), 1.0f,
					      buf + (a - lo), 1.0f, b - a);
		if (rc)
			break;
	}
	return rc < 0 && !err->code ? eng_fail(err, rc, "dist: reducing gradients failed") : rc;
}

static int gather_part(struct native *n, int64_t p, struct eng_error *err)
{
	struct native_shard *s = n->group.shard;
	int i = w_index(s, p), rc;

	if (s->held[i] == p)
		return 0;
	s->held[i] = -1;
	rc = native_shard_gather(n, s->w[i], s->range[p][0], s->range[p][1], err);
	if (rc == 0)
		s->held[i] = p;
	return rc;
}

static int zero_grads_of(struct native *n, int64_t p)
{
	struct native_shard *s = n->group.shard;

	return n->dev->ops->memset0(n->dev, s->g[g_index(s, p)],
				    (size_t)part_len(s, p) * sizeof(float));
}

/* llama_model.part (llama.h). Errors are the group's: any failure here
 * leaves the peers waiting in a collective, so the group is broken. */
static int part_hook(void *ctx, int64_t p, bool backward, bool end)
{
	struct native *n = ctx;
	struct native_shard *s = n->group.shard;
	int64_t head = LLAMA_PART_HEAD(s->L), embed = LLAMA_PART_EMBED(s->L);
	struct eng_error *err = &n->group.shard_err;
	int rc = 0;

	if (!end) {
		if (s->stage == 3) {
			rc = gather_part(n, p, err);
			if (rc == 0 && p == head && s->tied)
				rc = gather_part(n, embed, err);
		}
		/* The part's gradient scratch starts at zero (a tied head's
		 * is the embedding's, zeroed with the head's). */
		if (rc == 0 && backward && !(p == embed && s->tied))
			rc = zero_grads_of(n, p);
		if (rc == 0 && backward && p == head && s->tied)
			rc = zero_grads_of(n, embed);
	} else if (backward) {
		rc = reduce_range(n, s->g[g_index(s, p)], s->range[p][0], s->range[p][1], err);
	}
	if (rc)
		n->group.dist->broken = true;
	return rc;
}

/* Gradients of the model bound to the scratch buffers, and with ZeRO-3
 * its weights to the gathered buffers (layer l in slot l % 2). */
void native_shard_bind(struct native *n)
{
	struct native_shard *s = n->group.shard;

	for (int64_t p = 0; p < s->L + 2; p++) {
		if (s->stage == 3)
			model_weights_bind_range(&n->table, &n->cfg, s->w[w_index(s, p)],
						 s->range[p][0], s->range[p][1], &n->model.w);
		model_weights_bind_range(&n->table, &n->cfg, s->g[g_index(s, p)],
					 s->range[p][0], s->range[p][1], &n->model.g);
	}
	n->model.part = part_hook;
	n->model.part_ctx = n;
	native_shard_invalidate(n);
}

int native_shard_setup(struct native *n, struct eng_error *err)
{
	int stage = n->group.zero_stage;
	struct native_shard *s;
	int rc;

	if (stage < 2 || !n->group.dist)
		return 0;
	s = calloc(1, sizeof(*s));
	if (!s)
		return eng_fail(err, -ENOMEM, "dist: out of memory");
	n->group.shard = s;
	s->stage = stage;
	s->tensor_i = -1;
	s->L = n->cfg.num_layers;
	s->tied = param_table_find(&n->table, "lm_head.weight") < 0 &&
		  param_table_find(&n->table, "score.weight") < 0;
	rc = shard_ranges(n, s, err);
	if (rc == 0)
		rc = shard_alloc(n, s, err);
	return rc;
}

/* The tensor i's elements this rank holds, as table offsets [a, b)
 * (a == b: none). */
void native_shard_held(const struct native *n, int64_t i, int64_t *a, int64_t *b)
{
	const struct param_entry *e = &n->table.entries[i];
	int64_t lo = n->group.shard_off, hi = lo + n->group.shard_len;

	*a = e->offset > lo ? e->offset : lo;
	*b = e->offset + e->numel < hi ? e->offset + e->numel : hi;
	if (*b < *a)
		*b = *a;
}

int native_refuse_sharded(const struct native *n, int stage, const char *call,
			  struct eng_error *err)
{
	if (n->group.zero_stage < stage)
		return 0;
	return eng_fail(err, -ENOSYS, "%s: not built yet for a group with dist.zero_stage %d "
			"(the %s are sharded across the ranks); use zero_stage %d", call,
			n->group.zero_stage, stage == 3 ? "parameters" : "gradients", stage - 1);
}
