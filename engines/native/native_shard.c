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
 * The collectives run on a thread of their own (native_shard_comm.c), so
 * that they overlap the compute: entering a part starts the gather of the
 * next one (the next layer's slot is free: its last user is done), and a
 * part's reduction runs while the backward goes on to the next part
 * (layer gradients alternate between two scratch buffers; a buffer's
 * pending reduction is waited for, and its sum added to the slice,
 * before the buffer is zeroed for another part). Every rank must run the
 * same passes:
 * ForwardBackward agrees the number of micro-batches first and a rank
 * with fewer walks the parts of the missing ones (llama_walk_parts),
 * adding zero gradients.
 */
#include "native_engine.h"
#include "clock.h"

#include <stdlib.h>
#include <string.h>

/* Buffer indices, the same for the weights (ZeRO-3) and the gradient
 * scratch: layer l uses slot l % 2, the head and the embedding their own. */
enum { B_SLOT0, B_SLOT1, B_HEAD, B_EMBED, B_COUNT };

struct native_shard {
	int stage;
	int64_t L;
	bool tied;                  /* the head reads the embedding */
	int64_t (*range)[2];        /* [L + 2]: parts' [lo, hi) of the table */
	float *w[B_COUNT];          /* ZeRO-3 only */
	int64_t held[B_COUNT];      /* the part a weight buffer holds (or will,
				     * once w_ticket is done), or -1 */
	int64_t w_ticket[B_COUNT];  /* its gather's ticket; 0: complete */
	float *g[B_COUNT];
	int64_t g_part[B_COUNT];    /* the part whose reduction from the
				     * buffer is pending (g_ticket), or -1 */
	int64_t g_ticket[B_COUNT];
	struct shard_comm *comm;
	double pass_t0;             /* the call's start (statistics) */
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

static int buf_index(const struct native_shard *s, int64_t p)
{
	return p == LLAMA_PART_HEAD(s->L) ? B_HEAD : p == LLAMA_PART_EMBED(s->L) ? B_EMBED
										  : (int)(p & 1);
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
	return n->group.zero_stage >= 2 && !n->frozen;   /* a frozen base has none */
}

size_t native_shard_bytes(const struct native *n)
{
	return n->group.shard ? n->group.shard->bytes : 0;
}

/* The part ranges from the table: every tensor belongs to one part and
 * each part's tensors lie end to end. */
static int shard_ranges(struct native *n, struct native_shard *s, struct eng_error *err)
{
	int64_t parts = s->L + 2, *sum;

	s->range = malloc((size_t)parts * sizeof(*s->range));
	sum = calloc((size_t)parts, sizeof(*sum));
	if (!s->range || !sum) {
		free(sum);
		return eng_fail(err, -ENOMEM, "dist: out of memory");
	}
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
		sum[p] += e->numel;
	}
	for (int64_t p = 0; p < parts; p++)
		if (sum[p] != part_len(s, p)) {
			free(sum);
			return eng_fail(err, -EINVAL, "dist.zero_stage: part %lld of the model is "
					"not contiguous in its parameter table", (long long)p);
		}
	free(sum);
	return 0;
}

static int shard_alloc(struct native *n, struct native_shard *s, struct eng_error *err)
{
	int64_t layer = 0, len[B_COUNT];

	for (int64_t l = 0; l < s->L; l++)
		if (part_len(s, l) > layer)
			layer = part_len(s, l);
	len[B_SLOT0] = len[B_SLOT1] = layer;
	len[B_HEAD] = part_len(s, LLAMA_PART_HEAD(s->L));
	len[B_EMBED] = part_len(s, LLAMA_PART_EMBED(s->L));
	for (int i = 0; i < B_COUNT; i++) {
		s->held[i] = -1;
		if (s->stage < 3)
			continue;
		s->w[i] = native_dalloc(n, (size_t)len[i] * sizeof(float));
		if (!s->w[i])
			return eng_fail(err, -ENOMEM, "dist.zero_stage 3: out of memory for the "
					"gathered layers (%lld floats)", (long long)len[i]);
		s->bytes += (size_t)len[i] * sizeof(float);
	}
	for (int i = 0; i < B_COUNT; i++)
		s->g_part[i] = -1;
	for (int i = 0; i < B_COUNT && native_shard_grads(n); i++) {
		s->g[i] = native_dalloc(n, (size_t)len[i] * sizeof(float));
		if (!s->g[i])
			return eng_fail(err, -ENOMEM, "dist.zero_stage: out of memory for the "
					"gradient buffers (%lld floats)", (long long)len[i]);
		s->bytes += (size_t)len[i] * sizeof(float);
	}
	return 0;
}

void native_shard_free(struct native *n)
{
	struct native_shard *s = n->group.shard;

	if (!s)
		return;
	shard_comm_stop(s->comm);
	for (int i = 0; i < B_COUNT; i++)
		native_dfree(n, s->w[i]);
	for (int i = 0; i < B_COUNT; i++)
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
	for (int i = 0; i < B_COUNT; i++)
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

	return native_family_sliced(n, f) ? p : p + n->group.shard_off;
}

/* The part of the table's [lo, hi) in this rank's slice: [*a, *b), empty
 * (a == b) when none. */
static void own_range(const struct native *n, int64_t lo, int64_t hi, int64_t *a, int64_t *b)
{
	int64_t s0 = n->group.shard_off, s1 = s0 + n->group.shard_len;

	*a = lo > s0 ? lo : s0;
	*b = hi < s1 ? hi : s1;
	if (*b < *a)
		*b = *a;
}

/* This rank's piece of [lo, hi) into buf (buf[0] is element lo), for a
 * gather whose broadcasts bring the others'. */
static int copy_own_piece(struct native *n, float *buf, int64_t lo, int64_t hi)
{
	int64_t a, b;

	own_range(n, lo, hi, &a, &b);
	if (a == b)
		return 0;
	return n->dev->ops->copy_d2d(n->dev, buf + (a - lo),
				     native_slice(n, FAM_PARAMS) + (a - n->group.shard_off),
				     (size_t)(b - a) * sizeof(float));
}

/* Post the gather of [lo, hi) into buf, model part `part` or -1 (the
 * engine's device work first). */
static int post_gather(struct native *n, float *buf, int64_t lo, int64_t hi, int64_t part,
		       int64_t *ticket)
{
	int rc = copy_own_piece(n, buf, lo, hi);

	if (rc == 0)
		rc = n->dev->ops->sync(n->dev);
	if (rc == 0)
		*ticket = shard_comm_post(n->group.shard->comm, false, buf, lo, hi, part);
	return rc;
}

int native_shard_gather(struct native *n, float *buf, int64_t lo, int64_t hi,
			struct eng_error *err)
{
	int64_t t = 0;
	int rc = post_gather(n, buf, lo, hi, -1, &t);

	if (rc)
		return eng_fail(err, rc, "dist: copying this rank's parameters failed");
	return shard_comm_wait(n->group.shard->comm, t, err);
}

/* Part p's weights in its buffer: gathered, or being gathered (ticket). */
static int start_gather(struct native *n, int64_t p, struct eng_error *err)
{
	struct native_shard *s = n->group.shard;
	int i = buf_index(s, p), rc;

	if (s->held[i] == p)
		return 0;
	s->held[i] = -1;
	rc = post_gather(n, s->w[i], s->range[p][0], s->range[p][1], p, &s->w_ticket[i]);
	if (rc)
		return eng_fail(err, rc, "dist: copying this rank's parameters failed");
	s->held[i] = p;
	return 0;
}

/* Part p's weights there now. */
static int have_weights(struct native *n, int64_t p, struct eng_error *err)
{
	struct native_shard *s = n->group.shard;
	int i = buf_index(s, p);
	int rc = start_gather(n, p, err);

	if (rc == 0 && s->w_ticket[i]) {
		rc = shard_comm_wait(s->comm, s->w_ticket[i], err);
		if (rc)
			s->held[i] = -1;
		else
			s->w_ticket[i] = 0;
	}
	return rc;
}

/* Gradient buffer j's pending reduction done, and its sum (on the pieces
 * this rank holds) added to this rank's slice of the gradients. */
static int finish_reduce(struct native *n, int j, struct eng_error *err)
{
	struct native_shard *s = n->group.shard;
	int64_t p = s->g_part[j], lo, hi, a, b;
	int rc;

	if (p < 0)
		return 0;
	s->g_part[j] = -1;
	rc = shard_comm_wait(s->comm, s->g_ticket[j], err);
	if (rc)
		return rc;
	lo = s->range[p][0];
	hi = s->range[p][1];
	own_range(n, lo, hi, &a, &b);
	if (a < b)
		rc = n->dev->k->axpby(n->dev, native_slice(n, FAM_GRADS) + (a - n->group.shard_off),
				      1.0f, s->g[j] + (a - lo), 1.0f, b - a);
	return rc ? eng_fail(err, rc, "dist: adding the reduced gradients failed") : 0;
}

/* Gradient buffer of part p free (its last reduction finished) and zero. */
static int fresh_grads(struct native *n, int64_t p, struct eng_error *err)
{
	struct native_shard *s = n->group.shard;
	int j = buf_index(s, p);
	int rc = finish_reduce(n, j, err);

	if (rc == 0 && (rc = n->dev->ops->memset0(n->dev, s->g[j], (size_t)part_len(s, p) *
						  sizeof(float))))
		rc = eng_fail(err, rc, "device: zeroing gradients failed");
	return rc;
}

/* llama_model.part (llama.h). Errors are the group's: any failure here
 * leaves the peers waiting in a collective, so the group is broken. */
static int part_hook(void *ctx, int64_t p, bool backward, bool end)
{
	struct native *n = ctx;
	struct native_shard *s = n->group.shard;
	int64_t head = LLAMA_PART_HEAD(s->L), embed = LLAMA_PART_EMBED(s->L), next;
	struct eng_error *err = &n->group.shard_err;
	int rc = 0;

	if (!end) {
		if (s->stage == 3) {
			rc = have_weights(n, p, err);
			if (rc == 0 && p == head && s->tied)
				rc = have_weights(n, embed, err);
			/* the next part's weights come while this one computes
			 * (its buffer's last user is done) */
			next = llama_part_next(s->L, p, backward);
			if (rc == 0 && next >= 0)
				rc = start_gather(n, next, err);
		}
		/* The part's gradient scratch starts at zero (a tied head's
		 * is the embedding's, zeroed with the head's). */
		backward = backward && native_shard_grads(n);   /* a frozen base: none */
		if (rc == 0 && backward && !(p == embed && s->tied))
			rc = fresh_grads(n, p, err);
		if (rc == 0 && backward && p == head && s->tied)
			rc = fresh_grads(n, embed, err);
	} else if (backward && native_shard_grads(n)) {
		int j = buf_index(s, p);

		rc = n->dev->ops->sync(n->dev);
		if (rc == 0) {
			s->g_ticket[j] = shard_comm_post(s->comm, true, s->g[j], s->range[p][0],
							 s->range[p][1], p);
			s->g_part[j] = p;
		} else {
			rc = eng_fail(err, rc, "device: gradients of a part failed");
		}
	}
	if (rc)
		n->group.dist->broken = true;
	return rc;
}

int native_shard_drain(struct native *n, struct eng_error *err)
{
	struct native_shard *s = n->group.shard;
	int rc = 0;

	if (!s)
		return 0;
	for (int j = 0; j < B_COUNT; j++) {
		int r = finish_reduce(n, j, err);

		rc = rc ? rc : r;
	}
	if (rc == 0)
		rc = shard_comm_drain(s->comm, err);
	else
		(void)shard_comm_drain(s->comm, NULL);
	for (int i = 0; i < B_COUNT; i++) {
		if (rc)
			s->held[i] = -1;   /* a failed gather may have left it partial */
		s->w_ticket[i] = 0;
	}
	return rc;
}

void native_shard_call_begin(struct native *n)
{
	struct native_sync_stats st;

	if (!n->group.shard)
		return;
	shard_comm_stats(n->group.shard->comm, &st, true);
	n->group.shard->pass_t0 = eng_now_s();
}

void native_shard_call_end(struct native *n)
{
	if (!n->group.shard)
		return;
	shard_comm_stats(n->group.shard->comm, &n->group.sync_last, false);
	n->group.sync_last.pass_s = eng_now_s() - n->group.shard->pass_t0;
}

/* Gradients of the model bound to the scratch buffers, and with ZeRO-3
 * its weights to the gathered buffers (layer l in slot l % 2). */
void native_shard_bind(struct native *n)
{
	struct native_shard *s = n->group.shard;

	for (int64_t p = 0; p < s->L + 2; p++) {
		if (s->stage == 3)
			model_weights_bind_range(&n->table, &n->cfg, s->w[buf_index(s, p)],
						 s->range[p][0], s->range[p][1], &n->model.w);
		if (native_shard_grads(n))
			model_weights_bind_range(&n->table, &n->cfg, s->g[buf_index(s, p)],
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

	if (!n->group.dist || !(native_shard_params(n) || native_shard_grads(n)))
		return 0;   /* ZeRO-1, or 2 over a frozen base (no gradients to shard) */
	s = calloc(1, sizeof(*s));
	if (!s)
		return eng_fail(err, -ENOMEM, "dist: out of memory");
	n->group.shard = s;
	s->stage = stage;
	s->tensor_i = -1;
	s->L = n->cfg.num_layers;
	s->tied = param_table_tied(&n->table);
	rc = shard_ranges(n, s, err);
	if (rc == 0)
		rc = shard_alloc(n, s, err);
	if (rc == 0)
		rc = shard_comm_start(n, &s->comm, err);
	return rc;
}

/* The tensor i's elements this rank holds, as table offsets [a, b)
 * (a == b: none). */
void native_shard_held(const struct native *n, int64_t i, int64_t *a, int64_t *b)
{
	const struct param_entry *e = &n->table.entries[i];

	own_range(n, e->offset, e->offset + e->numel, a, b);
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
