/* native_fb.c — ForwardBackward of the native engine: the batch planned
 * into micro-batches (engines/batch/planner.c), each gathered, uploaded,
 * run forward and, unless forward-only, backward with the loss's
 * gradients; a failed call takes back the gradients it added; a reducing
 * call's last backward reduces them over the group (native_grad_sync.c).
 */
#include "native_engine.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../batch/planner.h"
#include "checked.h"

int native_check_tokens(const struct native *n, const char *field, const int32_t *ids,
			int64_t count, struct eng_error *err)
{
	for (int64_t t = 0; ids && t < count; t++)
		if (ids[t] < 0 || ids[t] >= n->cfg.vocab_size)
			return eng_fail(err, -EINVAL,
					"%s[%lld]: token %d outside the vocabulary [0, %lld)", field,
					(long long)t, ids[t], (long long)n->cfg.vocab_size);
	return 0;
}

/* The experts layers of n's model, in order: their decoder layers
 * (layers[Lm], the caller's; Lm <= MODEL_MAX_LAYERS). */
static int64_t experts_layers(const struct model_config *c, int64_t *layers)
{
	int64_t Lm = 0;

	for (int64_t l = 0; l < c->num_layers; l++)
		if (model_layer_mlp(c, l) == MODEL_MLP_MOE)
			layers[Lm++] = l;
	return Lm;
}

/* A routing replay (engine.h's routed_experts) against the model: its
 * shape, then each row of a layer it routes (the experts layers' rows,
 * the dense ones' unread): ids in [0, E), distinct. */
static int check_routing(const struct native *n, const struct engine_batch *b,
			 struct eng_error *err)
{
	const struct model_config *c = &n->cfg;
	int64_t layers[MODEL_MAX_LAYERS], Lm = experts_layers(c, layers), L = b->routed_layers;
	int64_t E = c->num_experts, k = c->experts_per_tok, *seen;
	int rc = 0;

	if (!Lm)
		return eng_fail(err, -EINVAL, "routed_experts: the model has no experts layers "
				"(a dense model routes nothing)");
	if (b->routed_k != k)
		return eng_fail(err, -EINVAL, "routed_experts: shape [%lld, %lld, %lld]; the model "
				"sends each token to experts_per_tok %lld experts", (long long)b->n,
				(long long)L, (long long)b->routed_k, (long long)k);
	if (L != Lm && L != c->num_layers)
		return eng_fail(err, -EINVAL, "routed_experts: %lld layers; the model has %lld "
				"experts layers (or give all %lld decoder layers)", (long long)L,
				(long long)Lm, (long long)c->num_layers);
	seen = malloc((size_t)E * sizeof(*seen));
	if (!seen)
		return eng_fail(err, -ENOMEM, "routed_experts: out of host memory");
	for (int64_t e = 0; e < E; e++)
		seen[e] = -1;
	for (int64_t t = 0, row = 0; t < b->n && !rc; t++)
		for (int64_t i = 0; i < Lm && !rc; i++, row++) {
			int64_t l = L == Lm ? i : layers[i];
			const int32_t *ids = b->routed_experts + (t * L + l) * k;

			for (int64_t j = 0; j < k && !rc; j++) {
				if (ids[j] < 0 || ids[j] >= E)
					rc = eng_fail(err, -EINVAL, "routed_experts[%lld][%lld][%lld]: "
						      "expert %d outside [0, num_experts %lld)",
						      (long long)t, (long long)l, (long long)j,
						      ids[j], (long long)E);
				else if (seen[ids[j]] == row)
					rc = eng_fail(err, -EINVAL, "routed_experts[%lld][%lld]: expert "
						      "%d twice (a token's experts are distinct)",
						      (long long)t, (long long)l, ids[j]);
				else
					seen[ids[j]] = row;
			}
		}
	free(seen);
	return rc;
}

/* engine_forward_backward applied engine_batch_check; what needs the
 * model is checked here. */
static int validate_batch(struct native *n, const struct engine_batch *b,
			  struct eng_error *err)
{
	int rc = native_check_tokens(n, "input_ids", b->input_ids, b->n, err);

	if (!rc)
		rc = native_check_tokens(n, "target_ids", b->target_ids, b->n, err);
	return rc || !b->routed_experts ? rc : check_routing(n, b, err);
}

/* Host-side description of one micro-batch. */
struct mb_host {
	int64_t T;
	int32_t B;
	int32_t *ids, *pos, *targets, *cu, *seq_lens, *seq_index; /* [T] / [B+1] / [B] */
	int64_t *token_index;                                   /* [T] */
	float *out;                                             /* [3, T] target-aligned outputs */
	float *dout;                                            /* [3, T] loss gradients */
	float *rows;                                            /* [3, T] row-aligned */
	/* A mixture of experts' routing (llama_batch's route, route_out):
	 * the experts layers' decoder layers [Lm]; the micro-batch's replayed
	 * routing, host and device [Lm, T, k] (NULL: none); the routing its
	 * forward used [Lm, T, k] (NULL: not wanted). */
	int64_t Lm, k, layers[MODEL_MAX_LAYERS];
	int32_t *route_in, *route_dev, *route_out;
};

static void mb_host_free(struct mb_host *h)
{
	free(h->ids);
	free(h->pos);
	free(h->targets);
	free(h->cu);
	free(h->seq_lens);
	free(h->seq_index);
	free(h->token_index);
	free(h->out);
	free(h->dout);
	free(h->rows);
	free(h->route_in);
	free(h->route_out);
}

static int mb_host_alloc(struct mb_host *h, int64_t T, int64_t B)
{
	memset(h, 0, sizeof(*h));
	h->ids = malloc(T * sizeof(int32_t));
	h->pos = malloc(T * sizeof(int32_t));
	h->targets = malloc(T * sizeof(int32_t));
	h->cu = malloc((B + 1) * sizeof(int32_t));
	h->seq_lens = malloc(B * sizeof(int32_t));
	h->seq_index = malloc(B * sizeof(int32_t));
	h->token_index = malloc(T * sizeof(int64_t));
	h->out = malloc(3 * T * sizeof(float));
	h->dout = malloc(3 * T * sizeof(float));
	h->rows = malloc(3 * T * sizeof(float));
	if (!h->ids || !h->pos || !h->targets || !h->cu || !h->seq_lens || !h->seq_index ||
	    !h->token_index || !h->out || !h->dout || !h->rows) {
		mb_host_free(h);
		return -ENOMEM;
	}
	return 0;
}

/* The routing buffers of a call of micro-batches up to T tokens that
 * replays a routing (b->routed_experts) or returns it (want): host
 * memory here, the device's by the caller. */
static int mb_host_routes(struct mb_host *h, const struct model_config *c,
			  const struct engine_batch *b, bool want, int64_t T)
{
	size_t cells;

	h->Lm = experts_layers(c, h->layers);
	h->k = c->experts_per_tok;
	if (!h->Lm || (!b->routed_experts && !want))
		return 0;
	if (!ck_mul_size((size_t)h->Lm * (size_t)h->k, (size_t)T, &cells) ||
	    cells > SIZE_MAX / sizeof(int32_t))
		return -ENOMEM;
	if (b->routed_experts && !(h->route_in = malloc(cells * sizeof(int32_t))))
		return -ENOMEM;
	if (want && !(h->route_out = malloc(cells * sizeof(int32_t))))
		return -ENOMEM;
	return 0;
}

/* Micro-batch h's rows of the call's routing replay, [Lm, T, k]. */
static void mb_gather_routes(const struct engine_batch *b, struct mb_host *h)
{
	int64_t k = h->k, L = b->routed_layers;

	for (int64_t i = 0; i < h->Lm; i++) {
		int64_t l = L == h->Lm ? i : h->layers[i];

		for (int64_t t = 0; t < h->T; t++)
			memcpy(h->route_in + (i * h->T + t) * k,
			       b->routed_experts + (h->token_index[t] * L + l) * k,
			       (size_t)k * sizeof(int32_t));
	}
}

/* The routing micro-batch h's forward used into the call's [n, Lm, k]. */
static void mb_scatter_routes(const struct mb_host *h, int32_t *out)
{
	int64_t k = h->k;

	for (int64_t i = 0; i < h->Lm; i++)
		for (int64_t t = 0; t < h->T; t++)
			memcpy(out + (h->token_index[t] * h->Lm + i) * k,
			       h->route_out + (i * h->T + t) * k, (size_t)k * sizeof(int32_t));
}

/* Gather micro-batch `k` of the plan from the request. */
static void mb_gather(const struct engine_batch *b, const struct mb_plan *p, int32_t k,
		      struct mb_host *h)
{
	int64_t t = 0;

	h->B = p->mb_start[k + 1] - p->mb_start[k];
	h->cu[0] = 0;
	for (int32_t j = 0; j < h->B; j++) {
		int32_t s = p->seq_order[p->mb_start[k] + j];
		int64_t off = p->seq_offset[s];
		int32_t len = b->seq_lens[s];

		h->seq_index[j] = s;
		h->seq_lens[j] = len;
		for (int32_t i = 0; i < len; i++, t++) {
			h->ids[t] = b->input_ids[off + i];
			h->pos[t] = i;
			h->token_index[t] = off + i;
			h->targets[t] = i + 1 >= len ? -1 :
					b->target_ids ? b->target_ids[off + i + 1] :
					b->input_ids[off + i + 1];
		}
		h->cu[j + 1] = (int32_t)t;
	}
	h->T = t;
	if (h->route_in)
		mb_gather_routes(b, h);
}

/* rows (row-aligned: row r predicts token r+1) -> target-aligned out:
 * out[t] = rows[t-1] inside a sequence, 0 at each sequence start. */
static void rows_to_targets(const struct mb_host *h, const float *rows, float *out)
{
	for (int32_t j = 0; j < h->B; j++) {
		int64_t s = h->cu[j], e = h->cu[j + 1];

		out[s] = 0.0f;
		for (int64_t t = s + 1; t < e; t++)
			out[t] = rows[t - 1];
	}
}

/* The transpose: rows[r] = d[r+1] inside a sequence, 0 on its last row. */
static void targets_to_rows(const struct mb_host *h, const float *d, float *rows)
{
	for (int32_t j = 0; j < h->B; j++) {
		int64_t s = h->cu[j], e = h->cu[j + 1];

		for (int64_t t = s; t + 1 < e; t++)
			rows[t] = d[t + 1];
		rows[e - 1] = 0.0f;
	}
}

static int upload_mb(struct native *n, const struct mb_host *h)
{
	const struct device_ops *o = n->dev->ops;
	int rc;

	if ((rc = o->copy_h2d(n->dev, n->io.ids, h->ids, h->T * sizeof(int32_t))) ||
	    (rc = o->copy_h2d(n->dev, n->io.pos, h->pos, h->T * sizeof(int32_t))) ||
	    (rc = o->copy_h2d(n->dev, n->io.targets, h->targets, h->T * sizeof(int32_t))))
		return rc;
	if (h->route_in &&
	    (rc = o->copy_h2d(n->dev, h->route_dev, h->route_in,
			      (size_t)(h->Lm * h->T * h->k) * sizeof(int32_t))))
		return rc;
	return o->copy_h2d(n->dev, n->io.cu_seqlens, h->cu, (h->B + 1) * sizeof(int32_t));
}

/* A mixture of experts' share of a micro-batch of T tokens, after its
 * forward: its auxiliary loss into the call's (weighted by T / n), its
 * layers' choices into the call's counts (n->moe_counts, [L][E]), and
 * the scale of the auxiliary loss's gradient its backward adds: the
 * coefficient when the config asks for the loss (output_router_logits),
 * times T / n and the group's gradient scale, as a loss's own. */
static void experts_pass(struct native *n, struct llama_model *m, const struct engine_batch *b,
			 struct engine_fb_result *res, int64_t T)
{
	const struct model_config *c = &m->cfg;
	int64_t E = c->num_experts;
	double share = (double)T / (double)b->n;

	res->router_aux_loss += share * m->moe_aux;
	res->router_aux_coef = b->forward_only || !c->output_router_logits ? 0.0
			       : c->router_aux_loss_coef;
	m->moe_aux_scale = res->router_aux_coef * share * native_grad_scale(n);
	for (int64_t l = 0; n->moe_counts && l < c->num_layers; l++) {
		const int64_t *off = m->moe_off + l * (E + 1);

		if (model_layer_mlp(c, l) == MODEL_MLP_MOE)
			for (int64_t e = 0; e < E; e++)
				n->moe_counts[l * E + e] += off[e + 1] - off[e];
	}
}

_Static_assert(ENGINE_MAX_LAYERS == MODEL_MAX_LAYERS, "engine.h's bound is the model's");
_Static_assert(ENGINE_MAX_EXPERTS_PER_TOK == MODEL_MAX_EXPERTS_PER_TOK,
	       "engine.h's bound is the model's");

/* Each experts layer's load over the call (engine.h), into res. */
static void experts_load(const struct native *n, const struct engine_batch *b,
			 struct engine_fb_result *res)
{
	const struct model_config *c = &n->cfg;
	int64_t E = c->num_experts;
	double mean = (double)b->n * (double)c->experts_per_tok / (double)E;
	int32_t cap = res->expert_layers;

	res->expert_layers = 0;
	for (int64_t l = 0; n->moe_counts && l < c->num_layers; l++) {
		int64_t most = 0;

		if (model_layer_mlp(c, l) != MODEL_MLP_MOE)
			continue;
		for (int64_t e = 0; e < E; e++)
			most = n->moe_counts[l * E + e] > most ? n->moe_counts[l * E + e] : most;
		if (res->expert_load && res->expert_layers < cap)
			res->expert_load[res->expert_layers] = (double)most / mean;
		res->expert_layers++;
	}
}

/* One micro-batch up to its backward pass: inputs up, forward, outputs
 * into res, the loss and its gradients down to the device (mb_backward
 * then runs the pass). */
static int mb_forward(struct native *n, struct llama_model *m, const struct engine_batch *b,
		      struct engine_fb_result *res, struct mb_host *h,
		      float inv_temp, struct eng_error *err)
{
	const struct device_ops *o = n->dev->ops;
	int64_t T = h->T, cap = n->io.cap_tokens;
	struct llama_batch lb = {
		.T = T, .B = h->B, .ids = n->io.ids, .pos = n->io.pos,
		.cu_seqlens = n->io.cu_seqlens, .targets = n->io.targets,
		.route = h->route_in ? h->route_dev : NULL, .route_out = h->route_out,
	};
	float *rows = n->io.rows, *drows = n->io.drows;
	float *out_logp = h->out, *out_ent = h->out + T, *out_val = h->out + 2 * T;
	struct engine_loss_io io;
	int rc;

	rc = upload_mb(n, h);
	if (rc)
		return eng_fail(err, rc, "device: copy of micro-batch inputs failed");
	rc = llama_forward(m, &lb, inv_temp, !b->forward_only, rows, rows + cap,
			   rows + 2 * cap);
	if (rc)
		return eng_fail(err, rc, "forward: device kernel failed (%s)", eng_strerror(rc));
	if (m->moe_off)
		experts_pass(n, m, b, res, T);
	if (h->route_out && res->routed_experts)
		mb_scatter_routes(h, res->routed_experts);
	if (n->value_model) {
		rc = o->copy_d2h(n->dev, h->rows + 2 * T, rows + 2 * cap, T * sizeof(float));
		memset(out_logp, 0, 2 * T * sizeof(float));
		rows_to_targets(h, h->rows + 2 * T, out_val);
	} else {
		if (!(rc = o->copy_d2h(n->dev, h->rows, rows, T * sizeof(float))))
			rc = o->copy_d2h(n->dev, h->rows + T, rows + cap, T * sizeof(float));
		rows_to_targets(h, h->rows, out_logp);
		rows_to_targets(h, h->rows + T, out_ent);
		memset(out_val, 0, T * sizeof(float));
	}
	if (rc)
		return eng_fail(err, rc, "device: copy of outputs failed");

	for (int64_t t = 0; t < T; t++) {
		int64_t dst = h->token_index[t];

		if (res->log_probs)
			res->log_probs[dst] = out_logp[t];
		if (res->entropy)
			res->entropy[dst] = out_ent[t];
		if (res->values && n->value_model)
			res->values[dst] = out_val[t];
	}
	if (!b->loss_fn)
		return 0;

	memset(h->dout, 0, 3 * T * sizeof(float));
	io = (struct engine_loss_io){
		.n = T, .num_seqs = h->B, .seq_lens = h->seq_lens, .seq_index = h->seq_index,
		.token_index = h->token_index, .log_probs = out_logp, .entropy = out_ent,
		.values = n->value_model ? out_val : NULL, .d_log_probs = h->dout,
		.d_entropy = h->dout + T, .d_values = n->value_model ? h->dout + 2 * T : NULL,
		.forward_only = b->forward_only,
		.grad_scale = native_grad_scale(n),
	};
	rc = b->loss_fn(b->loss_ctx, &io, err);
	if (rc)
		return rc;
	if (b->forward_only)
		return 0;

	for (int k = 0; k < 3; k++)
		targets_to_rows(h, h->dout + k * T, h->rows + k * T);
	for (int k = 0; k < 3 && !rc; k++)
		rc = o->copy_h2d(n->dev, drows + k * cap, h->rows + k * T, T * sizeof(float));
	if (rc)
		return eng_fail(err, rc, "device: copy of loss gradients failed");
	return 0;
}

/* The backward pass of the micro-batch mb_forward ran last. */
static int mb_backward(struct native *n, struct llama_model *m, const struct mb_host *h,
		       float inv_temp, struct eng_error *err)
{
	int64_t cap = n->io.cap_tokens;
	struct llama_batch lb = {
		.T = h->T, .B = h->B, .ids = n->io.ids, .pos = n->io.pos,
		.cu_seqlens = n->io.cu_seqlens, .targets = n->io.targets,
		.route = h->route_in ? h->route_dev : NULL,   /* a recompute routes alike */
	};
	float *drows = n->io.drows;
	int rc = llama_backward(m, &lb, inv_temp, drows, drows + cap, drows + 2 * cap);

	return rc ? eng_fail(err, rc, "backward: device kernel failed (%s)", eng_strerror(rc)) : 0;
}

/* A training call that failed or was cancelled after some micro-batches:
 * the gradients back to what they were (zero, or the copy in undo). A
 * failure here is the device's: the error says the gradients are lost. */
static void undo_gradients(struct native *n, const float *undo, struct eng_error *err)
{
	size_t gbytes = (size_t)native_family_len(n, FAM_GRADS) * sizeof(float);
	int rc;

	if (undo)
		rc = n->dev->ops->copy_d2d(n->dev, n->fam[FAM_GRADS].dev, undo, gbytes);
	else if (n->grad_calls == 0)
		rc = n->dev->ops->memset0(n->dev, n->fam[FAM_GRADS].dev, gbytes);
	else
		return;  /* not cancellable, and not a cancellation: as before */
	if (rc) {
		eng_error_clear(err);
		eng_fail(err, rc, "ForwardBackward: failed and its gradients could not be undone");
	}
}

/* The last micro-batch's backward pass of a reducing call, with its
 * gradients reduced across the group in buckets as the pass completes
 * them (native_grad_sync.c; an adapter's at once after the pass,
 * native_dist_reduce_now). Any failure here breaks the group: the peers
 * agreed to reduce. */
static int reduce_pass(struct native *n, struct llama_model *m, const struct mb_host *h,
		       float inv_temp, struct eng_error *err)
{
	int rc;

	if (n->lora) {
		/* An adapter's gradients: reduced once the pass is over. */
		rc = mb_backward(n, m, h, inv_temp, err);
		if (rc) {
			n->group.dist->broken = true;   /* the peers are reducing */
			return rc;
		}
		return native_dist_reduce_now(n, err);
	}
	native_sync_begin(n);
	rc = mb_backward(n, &n->model, h, inv_temp, err);
	if (rc) {
		native_sync_abandon(n);
		return rc;
	}
	return native_sync_finish(n, err);
}

/* The engine whose model a pass runs, and whose part buffers and hooks
 * gather its weights: an adapter's base, else n itself. */
static struct native *pass_owner(struct native *n)
{
	return n->base ? n->base : n;
}

/* Why a pass of a sharded group failed: its part hook's collective when
 * that was it (native_shard.c), else what the pass said. */
static int shard_pass_error(struct native *n, int rc, struct eng_error *err)
{
	struct native *o = pass_owner(n);

	if (rc && o->group.shard_err.code) {
		*err = o->group.shard_err;
		rc = err->code;
	}
	eng_error_clear(&o->group.shard_err);
	return rc;
}

/* A rank's pass with no micro-batch of its own: its part of the group's
 * gathers and reductions (llama_walk_parts). */
static int walk_parts(struct native *n, struct llama_model *m, bool backward,
		      struct eng_error *err)
{
	int rc = llama_walk_parts(m, backward);

	if (rc)
		rc = eng_fail(err, rc, "%s: %s", backward ? "backward" : "forward",
			      eng_strerror(rc));
	return shard_pass_error(n, rc, err);
}

/* The micro-batches of a call in a group that shards its gradients or
 * parameters (dist.zero_stage 2, 3; an adapter's call over a base whose
 * parameters are sharded): every rank runs `passes` of them
 * (the group's most; a rank with fewer walks its parts for the rest,
 * adding nothing), and the ranks agree after each forward, so that a
 * loss or input error on one rank stops them all before the backward
 * pass that would reduce. *ret_k: the micro-batches begun. */
static int sharded_passes(struct native *n, struct llama_model *m, const struct engine_batch *b,
			  struct engine_fb_result *res, const struct mb_plan *plan,
			  int64_t passes, struct mb_host *h, float inv_temp, int32_t *ret_k,
			  struct eng_error *err)
{
	int32_t mine = plan->num_micro_batches;
	struct native *o = pass_owner(n);
	int rc = 0;

	for (*ret_k = 0; *ret_k < passes && rc == 0; ++*ret_k) {
		int32_t k = *ret_k;

		if (b->progress)
			b->progress(b->progress_ctx, "forward_backward", k, (int64_t)passes,
				    "micro-batches");
		if (k < mine) {
			mb_gather(b, plan, k, h);
			rc = shard_pass_error(n, mb_forward(n, m, b, res, h, inv_temp, err), err);
		} else if (native_shard_params(o)) {
			rc = walk_parts(n, m, false, err);
		}
		/* the previous backward's last reductions ran behind this
		 * forward; the agreement is the engine thread's collective */
		{
			/* drained whatever this rank's forward did: the comm
			 * thread must be idle before this thread's collective */
			int drained = native_shard_drain(o, &o->group.shard_err);

			rc = rc ? rc : shard_pass_error(n, drained, err);
			eng_error_clear(&o->group.shard_err);
		}
		rc = native_dist_agree(n, rc, "ForwardBackward", err);
		if (rc || b->forward_only)
			continue;
		if (k < mine) {
			rc = shard_pass_error(n, mb_backward(n, m, h, inv_temp, err), err);
		} else {
			rc = walk_parts(n, m, true, err);
		}
		if (rc)
			n->group.dist->broken = true;   /* the peers are reducing */
	}
	if (rc == 0)
		rc = shard_pass_error(n, native_shard_drain(o, &o->group.shard_err), err);
	else
		(void)native_shard_drain(o, NULL);
	return rc;
}

/* A call's routing buffers (mb_host_routes; the device's replay, and
 * res's [n, Lm, k] when wanted), before any state changes. */
static int call_routes(struct native *n, const struct engine_batch *b,
		       struct engine_fb_result *res, struct mb_host *h, int64_t max_T,
		       struct eng_error *err)
{
	bool want = res->want_routed_experts;
	size_t cells;

	if (mb_host_routes(h, &n->cfg, b, want, max_T))
		return eng_fail(err, -ENOMEM, "routed_experts: out of host memory");
	if (h->route_in &&
	    !(h->route_dev = native_dalloc(n, (size_t)(h->Lm * max_T * h->k) * sizeof(int32_t))))
		return eng_fail(err, -ENOMEM, "routed_experts: out of device memory");
	if (!h->route_out)
		return 0;
	if (!ck_mul_size((size_t)b->n * (size_t)h->Lm, (size_t)h->k, &cells) ||
	    cells > SIZE_MAX / sizeof(int32_t) ||
	    !(res->routed_experts = malloc(cells * sizeof(int32_t))))
		return eng_fail(err, -ENOMEM, "routed_experts: out of host memory for the "
				"routing of %lld tokens", (long long)b->n);
	res->routed_layers = h->Lm;
	res->routed_k = h->k;
	return 0;
}

/* The number of micro-batches every rank of a sharded group runs: the
 * most of any rank, once every rank is ready (rc) and makes the same
 * kind of call. */
static int agree_passes(struct native *n, int rc, const struct engine_batch *b,
			int64_t *passes, struct eng_error *err)
{
	int W = n->group.dist->world_size;
	int64_t mine[2] = { *passes, b->forward_only }, *all;

	rc = native_dist_agree(n, rc, "ForwardBackward", err);
	if (rc)
		return rc;
	all = calloc((size_t)W * 2, sizeof(*all));
	if (!all) {
		n->group.dist->broken = true;
		return eng_fail(err, -ENOMEM, "ForwardBackward: out of host memory for the "
				"group's agreement; the group is broken");
	}
	rc = native_dist_gather_host(n, all, mine, sizeof(mine), err);
	for (int r = 0; r < W && rc == 0; r++) {
		if (all[2 * r + 1] != mine[1])
			rc = eng_fail(err, -EINVAL, "forward_only: rank %d's ForwardBackward is %s "
				      "and this rank's is not: with dist.zero_stage %d every rank "
				      "makes the same kind of call at once; nothing changed", r,
				      all[2 * r + 1] ? "forward-only" : "a training call",
				      n->group.zero_stage);
		if (all[2 * r] > *passes)
			*passes = all[2 * r];
	}
	free(all);
	return rc;
}

int native_forward_backward(struct engine *e, const struct engine_batch *b,
			    struct engine_fb_result *res, struct eng_error *err)
{
	struct native *n = native_of(e);
	int64_t budget = b->max_tokens_per_micro_batch > 0 ? b->max_tokens_per_micro_batch
							   : n->default_budget;
	float temp = b->temperature > 0 ? b->temperature : 1.0f;
	/* A reducing call is a collective: it is not cancelled once it runs,
	 * and every exit before its reduction tells the peers (agree). */
	bool reducing = n->group.dist && b->reduce_gradients && !b->forward_only &&
			!native_shard_grads(n);
	/* ZeRO-2: a training call reduces as its backward goes; ZeRO-3: any
	 * call gathers the parameters (an adapter's, its base's). Either is a
	 * collective of every rank. */
	bool collective = native_shard_params(pass_owner(n)) ||
			  (native_shard_grads(n) && !b->forward_only);
	bool (*cancelled)(void *) = reducing || collective ? NULL : b->cancelled;
	bool agreed = false, reduced = false;
	struct mb_plan plan = {0};
	struct mb_host h = {0};
	struct llama_model *m = NULL;
	int64_t max_T = 0, max_B = 0, passes = 0;
	float *undo = NULL;
	int32_t k = 0;
	int rc;

	rc = validate_batch(n, b, err);
	if (rc == 0 && !b->forward_only)
		rc = native_refuse_frozen(n, "ForwardBackward", err);
	if (rc == 0)
		rc = native_require_placed(n, !b->forward_only, false, err);
	if (rc == 0)
		rc = mb_plan_make(b->seq_lens, b->num_seqs, budget, &plan, err);
	for (int32_t i = 0; rc == 0 && i < plan.num_micro_batches; i++) {
		if (plan.mb_tokens[i] > max_T)
			max_T = plan.mb_tokens[i];
		if (plan.mb_start[i + 1] - plan.mb_start[i] > max_B)
			max_B = plan.mb_start[i + 1] - plan.mb_start[i];
	}
	/* Everything the call needs is reserved before any state changes, so
	 * that a failure here leaves gradients untouched. */
	if (rc == 0)
		rc = native_fb_model(n, max_T, &m, err);
	if (rc == 0) {
		m->recompute = b->activation_recompute == ENGINE_RECOMPUTE_DEFAULT ?
			       n->recompute : b->activation_recompute == ENGINE_RECOMPUTE_ON;
		rc = llama_reserve(m, max_T, !b->forward_only, err);
		n->last_activation_bytes = llama_activation_bytes(m, max_T, !b->forward_only);
		if (n->base)
			n->base->last_activation_bytes = n->last_activation_bytes;
	}
	if (rc == 0)
		rc = native_io_reserve(n, max_T, max_B, err);
	if (rc == 0 && model_has_experts(&n->cfg)) {
		int64_t cells = n->cfg.num_layers * n->cfg.num_experts;

		free(n->moe_counts);
		n->moe_counts = calloc((size_t)cells, sizeof(*n->moe_counts));
		if (!n->moe_counts)
			rc = eng_fail(err, -ENOMEM, "experts: out of host memory");
	}
	res->router_aux_loss = res->router_aux_coef = 0.0;
	res->routed_experts = NULL;
	res->routed_layers = res->routed_k = 0;
	if (rc == 0 && mb_host_alloc(&h, max_T, max_B))
		rc = eng_fail(err, -ENOMEM, "micro-batch: out of host memory");
	if (rc == 0)
		rc = call_routes(n, b, res, &h, max_T, err);
	if (rc == 0 && reducing && !n->lora)
		rc = native_sync_prepare(n, err);
	/* A training call that may stop part-way keeps what undoes it: nothing
	 * when the gradients are zero now (undo = zero them), else a copy. */
	if (rc == 0 && !b->forward_only && n->grad_calls > 0 &&
	    (collective || ((cancelled || reducing) && plan.num_micro_batches > 1))) {
		size_t gbytes = (size_t)native_family_len(n, FAM_GRADS) * sizeof(float);

		undo = native_dalloc(n, gbytes);
		rc = undo ? n->dev->ops->copy_d2d(n->dev, undo, n->fam[FAM_GRADS].dev, gbytes) :
		     eng_fail(err, -ENOMEM, "cancellable call: no memory for a copy of the "
			      "gradients (%zu bytes)", gbytes);
	}
	/* grad_calls == 0: the gradients are zero (every path that leaves
	 * them otherwise counts a call or zeroes them), so the first backward
	 * pass writes its weight products instead of adding them. */
	if (m)
		m->grads_zero = n->grad_calls == 0 && !native_shard_grads(n);
	passes = plan.num_micro_batches;
	if (collective)
		rc = agree_passes(n, rc, b, &passes, err);
	if (collective && rc == 0) {
		native_shard_call_begin(pass_owner(n));
		rc = sharded_passes(n, m, b, res, &plan, passes, &h, 1.0f / temp, &k, err);
		native_shard_call_end(pass_owner(n));
		/* An adapter over a ZeRO-3 base: its own gradients (whole on
		 * every rank, ZeRO-1) reduced once the passes agreed and ran. */
		agreed = reducing;
		if (reducing && rc == 0) {
			reduced = true;
			rc = native_dist_reduce_now(n, err);
			if (rc)
				n->group.dist->broken = true;   /* the peers are reducing */
		}
	}
	for (k = collective ? k : 0; !collective && k < plan.num_micro_batches && !rc; k++) {
		bool last = k == plan.num_micro_batches - 1;

		if (b->progress)
			b->progress(b->progress_ctx, "forward_backward", k, plan.num_micro_batches,
				    "micro-batches");
		if (k > 0 && cancelled && cancelled(b->cancel_ctx)) {
			rc = eng_fail(err, -ECANCELED,
				      "ForwardBackward: cancelled after %d of %d micro-batches (the "
				      "client went away or its deadline passed); gradients as before",
				      k, plan.num_micro_batches);
			break;
		}
		mb_gather(b, &plan, k, &h);
		rc = mb_forward(n, m, b, res, &h, 1.0f / temp, err);
		if (rc || b->forward_only)
			continue;
		if (!(reducing && last)) {
			rc = mb_backward(n, m, &h, 1.0f / temp, err);
			continue;
		}
		agreed = true;
		rc = native_dist_agree(n, 0, "ForwardBackward", err);
		if (rc == 0) {
			reduced = true;
			rc = reduce_pass(n, m, &h, 1.0f / temp, err);
		}
	}
	if (reducing && !agreed)
		rc = native_dist_agree(n, rc, "ForwardBackward", err);
	if (rc == 0 && b->progress)
		b->progress(b->progress_ctx, "forward_backward", k, passes, "micro-batches");
	if (rc && reduced) {
		/* Reduced in part (the group is broken): dropped, as a failed step
		 * drops them. */
		(void)native_zero_grads(n, NULL);
	} else if (rc && !b->forward_only && k > 0) {
		undo_gradients(n, undo, err);
	}
	native_dfree(n, undo);
	native_dfree(n, h.route_dev);
	if (rc) {
		free(res->routed_experts);
		res->routed_experts = NULL;
	}
	native_adapter_detach(n);
	if (m)
		m->grads_zero = false;
	res->num_micro_batches = plan.num_micro_batches;
	if (n->moe_counts) {
		experts_load(n, b, res);
		free(n->moe_counts);
		n->moe_counts = NULL;
	} else {
		res->expert_layers = 0;
	}
	if (m && m->moe_off)
		m->moe_aux_scale = 0.0;
	if (rc == 0 && !b->forward_only) {
		n->grad_calls++;
		n->grad_tokens += b->n;
		n->group.grads_reduced = reducing;
	}
	mb_host_free(&h);
	mb_plan_free(&plan);
	return rc;
}
