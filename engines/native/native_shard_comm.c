/* native_shard_comm.c — the thread that runs a sharded group's part
 * collectives (native_shard.c) while the engine thread computes: the
 * engine posts each part's gather (its weights from their holders) or
 * reduction (its gradients to their holders) and later waits for it, so
 * that the next layer's gather and the last layer's reduction run behind
 * the current layer's compute.
 *
 * Ops run one at a time in the order posted, and every rank posts the
 * same ops in the same order (the passes are the same on every rank), so
 * the collectives match. Only the collectives themselves run here (dist
 * broadcast and reduce); the device work around them (a rank's own piece
 * copied in before a gather, a reduction's sum added to the slice after
 * it) stays on the engine thread, which also drains the queue before it
 * makes any collective of its own (dist.h: one thread at a time).
 */
#include "native_engine.h"
#include "clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUEUE 16

struct shard_op {
	bool reduce;                /* else a gather (broadcasts from holders) */
	float *buf;                 /* the part's buffer: elements [lo, hi) */
	int64_t lo, hi;
	int64_t part;               /* the model part (llama.h), -1: one tensor */
};

struct shard_comm {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool quit;
	struct native *n;
	struct shard_op q[QUEUE];
	int64_t posted, done;       /* tickets: op t is q[t % QUEUE] */
	int rc;                     /* the first failure; later ops are skipped */
	struct eng_error err;
	/* Statistics since shard_comm_stats_reset. */
	int64_t ops, bytes;
	double busy_s, wait_s;
};

/* The pieces of [lo, hi) that the ranks' slices cut it into: rank r holds
 * [r S, (r + 1) S); one collective each, rooted at its holder. */
static int run_op(struct native *n, const struct shard_op *op, struct eng_error *err)
{
	struct dist *d = n->group.dist;
	int64_t S = n->group.shard_len;
	int rc = 0;

	for (int64_t r = op->lo / S; r * S < op->hi && rc == 0; r++) {
		int64_t a = op->lo > r * S ? op->lo : r * S;
		int64_t b = op->hi < (r + 1) * S ? op->hi : (r + 1) * S;

		rc = op->reduce
		     ? d->ops->reduce(d, op->buf + (a - op->lo), b - a, DIST_F32, (int)r, NULL, err)
		     : d->ops->broadcast(d, op->buf + (a - op->lo), b - a, DIST_F32, (int)r, err);
	}
	return rc;
}

/* The first failure, naming what failed: "dist: gathering the weights of
 * layer 3: " and the collective's own message. */
static void op_failed(struct shard_comm *c, const struct shard_op *op, int rc,
		      const struct eng_error *err)
{
	int64_t L = c->n->cfg.num_layers;
	char part[48];

	if (op->part < 0)
		snprintf(part, sizeof(part), "a tensor");
	else if (op->part < L)
		snprintf(part, sizeof(part), "layer %lld", (long long)op->part);
	else
		snprintf(part, sizeof(part), "%s", op->part == LLAMA_PART_HEAD(L) ? "the head" :
			 "the embedding");
	eng_fail(&c->err, rc, "dist: %s of %s: %s",
		 op->reduce ? "reducing the gradients" : "gathering the weights", part,
		 err->code ? err->msg : "failed");
}

static void *comm_main(void *arg)
{
	struct shard_comm *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct shard_op op;
		struct eng_error err = {0};
		double t0;
		int rc = 0;

		while (!c->quit && c->done == c->posted)
			pthread_cond_wait(&c->cv, &c->mu);
		if (c->done == c->posted)
			break;
		op = c->q[c->done % QUEUE];
		pthread_mutex_unlock(&c->mu);
		t0 = eng_now_s();
		if (!c->rc)
			rc = run_op(c->n, &op, &err);
		pthread_mutex_lock(&c->mu);
		c->busy_s += eng_now_s() - t0;
		c->ops++;
		c->bytes += (op.hi - op.lo) * (int64_t)sizeof(float);
		if (rc && !c->rc) {
			c->rc = rc;
			op_failed(c, &op, rc, &err);
		}
		c->done++;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

int shard_comm_start(struct native *n, struct shard_comm **ret, struct eng_error *err)
{
	struct shard_comm *c = calloc(1, sizeof(*c));

	if (!c)
		return eng_fail(err, -ENOMEM, "dist: out of memory");
	c->n = n;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	if (pthread_create(&c->thread, NULL, comm_main, c)) {
		pthread_mutex_destroy(&c->mu);
		pthread_cond_destroy(&c->cv);
		free(c);
		return eng_fail(err, -ENOMEM, "dist: cannot start the part collectives' thread");
	}
	*ret = c;
	return 0;
}

void shard_comm_stop(struct shard_comm *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->quit = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	pthread_join(c->thread, NULL);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c);
}

int64_t shard_comm_post(struct shard_comm *c, bool reduce, float *buf, int64_t lo, int64_t hi,
			int64_t part)
{
	int64_t t;

	pthread_mutex_lock(&c->mu);
	while (c->posted - c->done == QUEUE)
		pthread_cond_wait(&c->cv, &c->mu);
	c->q[c->posted % QUEUE] = (struct shard_op){ reduce, buf, lo, hi, part };
	t = ++c->posted;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	return t;
}

int shard_comm_wait(struct shard_comm *c, int64_t ticket, struct eng_error *err)
{
	double t0 = eng_now_s();
	int rc;

	pthread_mutex_lock(&c->mu);
	while (c->done < ticket)
		pthread_cond_wait(&c->cv, &c->mu);
	c->wait_s += eng_now_s() - t0;
	rc = c->rc;
	if (rc && err && !err->code)
		*err = c->err;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int shard_comm_drain(struct shard_comm *c, struct eng_error *err)
{
	int64_t last;

	pthread_mutex_lock(&c->mu);
	last = c->posted;
	pthread_mutex_unlock(&c->mu);
	return shard_comm_wait(c, last, err);
}

void shard_comm_stats(struct shard_comm *c, struct native_sync_stats *ret, bool reset)
{
	pthread_mutex_lock(&c->mu);
	ret->buckets = c->ops;
	ret->bytes = c->bytes;
	ret->reduce_s = c->busy_s;
	ret->wait_s = c->wait_s;
	if (reset) {
		c->ops = c->bytes = 0;
		c->busy_s = c->wait_s = 0;
		c->rc = 0;
		memset(&c->err, 0, sizeof(c->err));
	}
	pthread_mutex_unlock(&c->mu);
}
