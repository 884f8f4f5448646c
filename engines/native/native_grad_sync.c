/* native_grad_sync.c — the gradient reduction of a data-parallel
 * ForwardBackward that asks for it (reduce_gradients), bucket by bucket,
 * while its last backward pass runs (docs/DISTRIBUTED.md).
 *
 * The backward pass completes the gradients from the end of the flat
 * parameter table towards its start (head and final norm, then layers
 * L-1 .. 0, then the embedding): llama_backward reports each part
 * (llama.h, grads_done) and the engine thread posts the offset above which
 * everything is complete. A thread of this module takes the completed part
 * in buckets of dist.bucket_bytes from the top and hands each bucket's
 * sum to the rank that owns it under ZeRO-1 (rank r owns the slice
 * [r * S, (r + 1) * S)): dist reduce to that root, split where the bucket
 * spans two slices. Afterwards every rank's gradient buffer holds the
 * group's sum in its own slice and zeros elsewhere, which is what the
 * optimizer step would have made with its reduce-scatter: that step is
 * then skipped (native_dist.c).
 *
 * On a device with a stream of its own (CUDA) each post also sets a device
 * mark, and the reduction of a bucket waits on the device for the mark of
 * the post that completed it, not on the host: the engine thread keeps
 * queueing the next layers meanwhile.
 *
 * Threads: the group's collectives run on this module's thread only
 * between sync_begin and sync_finish (or sync_abandon), which the engine
 * thread calls around the pass; at any other time only the engine thread
 * uses the group (dist.h).
 */
#include "native_engine.h"
#include "clock.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct grad_sync {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool quit;                 /* the thread ends */
	/* The pass, under mu. */
	bool active;               /* between begin and finish / abandon */
	bool abandoned;            /* start no more buckets */
	bool busy;                 /* a bucket's reduction is running */
	int64_t ready;             /* floats at offsets >= ready are complete */
	int64_t done;              /* [done, padded_total) is reduced */
	int posts;
	int rc;                    /* the first failure of the pass */
	struct eng_error err;
	struct native_sync_stats stats;
	double t_begin;
	/* Fixed for the group's life. */
	struct native *n;
	int64_t bucket;            /* floats */
	int64_t *ready_after;      /* [L + 2]: the offset a post of layer l means (l = L: the
				    * head; L + 1: the end of the pass, 0) */
	int64_t *post_at;          /* [L + 2]: the offsets posted in this pass, in order */
	void **marks;              /* [L + 2] device marks; NULL: the device queues nothing */
};

/* The mark to wait for before reading [a, ...): that of the first post
 * that made offset a complete (NULL without marks). */
static const void *mark_for(const struct grad_sync *s, int64_t a)
{
	if (!s->marks)
		return NULL;
	for (int i = 0; i < s->posts; i++)
		if (s->post_at[i] <= a)
			return s->marks[i];
	return s->marks[s->posts - 1];
}

/* [a, b) of the flat gradients to their owners: one reduce per slice it
 * spans, in slice order (the same calls on every rank). */
static int reduce_range(struct grad_sync *s, int64_t a, int64_t b, const void *mark,
			struct eng_error *err)
{
	struct native *n = s->n;
	struct dist *d = n->group.dist;
	float *g = n->fam[FAM_GRADS].dev;
	int64_t S = n->group.shard_len;
	int rc = 0;

	for (int64_t lo = a; lo < b && rc == 0;) {
		int owner = (int)(lo / S);
		int64_t hi = (int64_t)(owner + 1) * S < b ? (int64_t)(owner + 1) * S : b;

		rc = d->ops->reduce(d, g + lo, hi - lo, DIST_F32, owner, mark, err);
		lo = hi;
	}
	return rc;
}

/* A bucket to reduce now: [*a, done). Full buckets while the pass runs;
 * whatever is left once everything is complete. */
static bool next_bucket(const struct grad_sync *s, int64_t *a)
{
	int64_t avail = s->done - s->ready;

	if (!s->active || s->abandoned || s->rc || avail <= 0)
		return false;
	if (avail < s->bucket && s->ready > 0)
		return false;
	*a = avail > s->bucket ? s->done - s->bucket : s->ready;
	return true;
}

static void *sync_thread(void *arg)
{
	struct grad_sync *s = arg;
	struct eng_error err = {0};
	int64_t a, b;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->quit && !next_bucket(s, &a))
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->quit)
			break;
		b = s->done;
		const void *mark = mark_for(s, a);
		double t0 = eng_now_s();
		int rc;

		s->busy = true;
		pthread_mutex_unlock(&s->mu);
		eng_error_clear(&err);
		rc = reduce_range(s, a, b, mark, &err);
		pthread_mutex_lock(&s->mu);
		s->busy = false;
		s->stats.reduce_s += eng_now_s() - t0;
		if (rc) {
			s->rc = rc;
			s->err = err;
		} else {
			s->done = a;
			s->stats.buckets++;
			s->stats.bytes += (b - a) * (int64_t)sizeof(float);
		}
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* The offset above which everything is complete after llama's report for
 * `layer` (L: the head; 0: layer 0): the end of the last tensor that is
 * not complete yet (the embedding, whose gradient the head shares when
 * tied, and the layers below). A layout-independent bound: a complete
 * tensor below it is only reduced later. */
static int64_t ready_after_layer(const struct param_table *t, int64_t layer)
{
	int64_t emb = param_table_find(t, "model.embed_tokens.weight"), top = 0;

	for (int64_t i = 0; i < t->count; i++) {
		const struct param_entry *e = &t->entries[i];
		int64_t end = e->offset + e->numel;

		if ((i == emb || (e->layer >= 0 && e->layer < layer)) && end > top)
			top = end;
	}
	return top;
}

static void free_sync(struct grad_sync *s)
{
	struct device *dev = s->n->dev;

	for (int64_t i = 0; s->marks && i < s->n->cfg.num_layers + 2; i++)
		dev->ops->mark_free(dev, s->marks[i]);
	free(s->marks);
	free(s->ready_after);
	free(s->post_at);
	free(s);
}

static int sync_create(struct native *n, struct eng_error *err)
{
	struct device *dev = n->dev;
	int64_t L = n->cfg.num_layers;
	struct grad_sync *s = calloc(1, sizeof(*s));

	if (!s)
		return eng_fail(err, -ENOMEM, "gradient reduction: out of memory");
	s->n = n;
	s->bucket = n->group.bucket_bytes / (int64_t)sizeof(float);
	s->ready_after = calloc((size_t)L + 2, sizeof(*s->ready_after));
	s->post_at = calloc((size_t)L + 2, sizeof(*s->post_at));
	if (dev->ops->mark_new && (s->marks = calloc((size_t)L + 2, sizeof(void *))))
		for (int64_t i = 0; i < L + 2; i++)
			if (!(s->marks[i] = dev->ops->mark_new(dev))) {
				free_sync(s);
				return eng_fail(err, -ENOMEM, "gradient reduction: no device marks");
			}
	if (!s->ready_after || !s->post_at || (dev->ops->mark_new && !s->marks)) {
		free_sync(s);
		return eng_fail(err, -ENOMEM, "gradient reduction: out of memory");
	}
	for (int64_t l = 0; l <= L; l++)
		s->ready_after[l] = ready_after_layer(&n->table, l);
	s->ready_after[L + 1] = 0;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->thread, NULL, sync_thread, s) != 0) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		free_sync(s);
		return eng_fail(err, -ENOMEM, "gradient reduction: no thread");
	}
	n->group.sync = s;
	return 0;
}

void native_sync_stop(struct native *n)
{
	struct grad_sync *s = n->group.sync;

	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->quit = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	(void)pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free_sync(s);
	n->group.sync = NULL;
}

/* llama's grads_done: post the offset layer `layer` completes. */
static void post_layer(void *ctx, int64_t layer)
{
	struct native *n = ctx;
	struct grad_sync *s = n->group.sync;
	int64_t at = s->ready_after[layer];
	int rc = 0;

	if (s->posts >= n->cfg.num_layers + 2)
		return;         /* llama posts L + 1 times, finish once more */
	if (s->marks)
		rc = n->dev->ops->mark_set(n->dev, s->marks[s->posts]);
	pthread_mutex_lock(&s->mu);
	if (rc && !s->rc) {
		s->rc = rc;
		eng_fail(&s->err, rc, "gradient reduction: device mark failed");
	}
	s->post_at[s->posts++] = at;
	if (at < s->ready)
		s->ready = at;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

int native_sync_prepare(struct native *n, struct eng_error *err)
{
	return n->group.sync ? 0 : sync_create(n, err);
}

void native_sync_begin(struct native *n)
{
	struct grad_sync *s = n->group.sync;

	pthread_mutex_lock(&s->mu);
	s->active = true;
	s->abandoned = false;
	s->ready = s->done = n->group.padded_total;
	s->posts = 0;
	s->rc = 0;
	eng_error_clear(&s->err);
	memset(&s->stats, 0, sizeof(s->stats));
	s->t_begin = eng_now_s();
	pthread_mutex_unlock(&s->mu);
	n->model.grads_done = post_layer;
	n->model.grads_done_ctx = n;
}

int native_sync_finish(struct native *n, struct eng_error *err)
{
	struct grad_sync *s = n->group.sync;
	double t0;
	int rc;

	n->model.grads_done = NULL;
	post_layer(n, n->cfg.num_layers + 1);
	t0 = eng_now_s();
	pthread_mutex_lock(&s->mu);
	while (s->done > 0 && !s->rc)
		pthread_cond_wait(&s->cv, &s->mu);
	while (s->busy)
		pthread_cond_wait(&s->cv, &s->mu);
	s->active = false;
	rc = s->rc;
	if (rc)
		eng_fail(err, rc, "%s", s->err.msg);
	s->stats.wait_s = eng_now_s() - t0;
	s->stats.pass_s = eng_now_s() - s->t_begin;
	n->group.sync_last = s->stats;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void native_sync_abandon(struct native *n)
{
	struct grad_sync *s = n->group.sync;

	n->model.grads_done = NULL;
	pthread_mutex_lock(&s->mu);
	s->abandoned = true;
	while (s->busy)
		pthread_cond_wait(&s->cv, &s->mu);
	s->active = false;
	pthread_mutex_unlock(&s->mu);
	/* Every rank agreed to reduce, so the peers go on with buckets this
	 * rank will not reduce: they time out, and this rank's side of the
	 * group is out of step with theirs. */
	n->group.dist->broken = true;
}
