/* replay.c — the outcomes of recent request ids (see replay.h). Entries
 * sit in a hash table (by id; an entry is its adapter's and id's) and a
 * list in the order they were made; the oldest recorded entries are
 * forgotten first. The last applied id of each adapter is kept beside
 * them, one row per adapter, until replay_forget_scope. */
#include "replay.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

struct entry {
	struct entry *older, *newer;  /* age list */
	struct entry *hnext;          /* hash chain */
	struct replay *owner;
	char scope[ENGINE_ADAPTER_NAME_MAX + 1];  /* the adapter; "" = the base */
	char id[RPC_REQUEST_ID_MAX + 1];
	int method;
	uint64_t hash;                /* of the method and the request bytes */
	bool done;                    /* the original was answered */
	bool evicted;                 /* its reply bytes were dropped */
	int r;                        /* its outcome */
	struct eng_error err;
	uint8_t *reply;
	size_t reply_len;
	struct job *waiters;          /* duplicates, through job->next */
};

struct scope_last {
	char scope[ENGINE_ADAPTER_NAME_MAX + 1];
	char id[RPC_REQUEST_ID_MAX + 1];
};

struct replay {
	pthread_mutex_t lock;
	struct entry **buckets;
	size_t nbuckets;              /* a power of two */
	struct entry *oldest, *newest;
	int64_t n, bytes, max_entries, max_bytes;
	char last[RPC_REQUEST_ID_MAX + 1];     /* the base's */
	struct scope_last *scopes;             /* each adapter's */
	int n_scopes, cap_scopes;
	void (*requeue)(void *ctx, struct job *j);
	void *requeue_ctx;
};

static void on_finish(struct job *j, int rc, const struct eng_error *err);

int replay_new(int64_t max_entries, int64_t max_bytes,
	       void (*requeue)(void *ctx, struct job *j), void *ctx, struct replay **ret)
{
	struct replay *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->nbuckets = 64;
	while ((int64_t)r->nbuckets < max_entries && r->nbuckets < ((size_t)1 << 24))
		r->nbuckets <<= 1;
	r->buckets = calloc(r->nbuckets, sizeof(*r->buckets));
	if (!r->buckets) {
		free(r);
		return -ENOMEM;
	}
	r->max_entries = max_entries;
	r->max_bytes = max_bytes;
	r->requeue = requeue;
	r->requeue_ctx = ctx;
	pthread_mutex_init(&r->lock, NULL);
	*ret = r;
	return 0;
}

void replay_free(struct replay *r)
{
	struct entry *e, *next;

	if (!r)
		return;
	for (e = r->oldest; e; e = next) {
		next = e->newer;
		free(e->reply);
		free(e);
	}
	free(r->buckets);
	free(r->scopes);
	pthread_mutex_destroy(&r->lock);
	free(r);
}

static struct entry **slot(struct replay *r, const char *id)
{
	return &r->buckets[XXH64(id, strlen(id), 0) & (r->nbuckets - 1)];
}

static struct entry *find(struct replay *r, const char *scope, const char *id)
{
	struct entry *e;

	for (e = *slot(r, id); e && (strcmp(e->id, id) || strcmp(e->scope, scope));
	     e = e->hnext)
		;
	return e;
}

/* The row of an adapter's last applied id (lock held); NULL when it has
 * none and `add` is false or there is no memory for one. */
static struct scope_last *scope_row(struct replay *r, const char *scope, bool add)
{
	struct scope_last *v;

	for (int i = 0; i < r->n_scopes; i++)
		if (!strcmp(r->scopes[i].scope, scope))
			return &r->scopes[i];
	if (!add)
		return NULL;
	if (r->n_scopes == r->cap_scopes) {
		int cap = r->cap_scopes ? 2 * r->cap_scopes : 8;

		v = realloc(r->scopes, (size_t)cap * sizeof(*v));
		if (!v)
			return NULL;
		r->scopes = v;
		r->cap_scopes = cap;
	}
	v = &r->scopes[r->n_scopes++];
	snprintf(v->scope, sizeof(v->scope), "%s", scope);
	v->id[0] = '\0';
	return v;
}

/* An applied id (lock held): the last of its adapter. */
static void set_last(struct replay *r, const struct entry *e)
{
	struct scope_last *row;

	if (!e->scope[0]) {
		snprintf(r->last, sizeof(r->last), "%s", e->id);
		return;
	}
	row = scope_row(r, e->scope, true);
	if (row)  /* else out of memory: GetStatus shows an older id */
		snprintf(row->id, sizeof(row->id), "%s", e->id);
}

/* Unlink e from the table and the age list (lock held); the caller frees. */
static void unlink_entry(struct replay *r, struct entry *e)
{
	struct entry **pp;

	for (pp = slot(r, e->id); *pp != e; pp = &(*pp)->hnext)
		;
	*pp = e->hnext;
	if (e->older)
		e->older->newer = e->newer;
	else
		r->oldest = e->newer;
	if (e->newer)
		e->newer->older = e->older;
	else
		r->newest = e->older;
	r->n--;
	r->bytes -= (int64_t)e->reply_len;
}

/* Keep the bounds (lock held): drop the oldest replies past max_bytes,
 * then the oldest recorded entries past max_entries. Pending entries stay. */
static void enforce_bounds(struct replay *r)
{
	struct entry *e, *next;

	for (e = r->oldest; e && r->bytes > r->max_bytes; e = e->newer) {
		if (e->done && e->reply) {
			r->bytes -= (int64_t)e->reply_len;
			free(e->reply);
			e->reply = NULL;
			e->reply_len = 0;
			e->evicted = true;
		}
	}
	for (e = r->oldest; e && r->n > r->max_entries; e = next) {
		next = e->newer;
		if (e->done) {
			unlink_entry(r, e);
			free(e);
		}
	}
}

/* Answer one duplicate with an outcome (no lock held). */
static void answer(struct job *j, int rc, const struct eng_error *err, const uint8_t *reply,
		   size_t len, bool evicted)
{
	struct eng_error e2;

	if (evicted) {
		eng_error_clear(&e2);
		job_finish(j, eng_fail(&e2, -EEXIST,
				       "engined-request-id: '%s' was already applied; its reply is "
				       "no longer kept (server.replay_bytes)",
				       rpc_call_request_id(j->call)), &e2);
		return;
	}
	if (rc == 0 && !(j->m && j->m->server_streaming)) {
		free(j->reply);
		j->reply = malloc(len ? len : 1);
		if (!j->reply) {
			eng_error_clear(&e2);
			job_finish(j, eng_fail(&e2, -ENOMEM, "replay: out of memory"), &e2);
			return;
		}
		memcpy(j->reply, reply, len);
		j->reply_len = len;
	}
	job_finish(j, rc, err);
}

/* finish_hook of the job that owns a new id: record its outcome (or drop
 * the entry when the call had no effect) and answer the duplicates waiting
 * on it. */
static void on_finish(struct job *j, int rc, const struct eng_error *err)
{
	struct entry *e = j->finish_ctx;
	struct replay *r = e->owner;
	struct job *w, *next;
	struct eng_error copy;
	uint8_t *reply = NULL;
	size_t len = 0;

	eng_error_clear(&copy);
	if (err && err->code)
		copy = *err;
	if (rc == 0 && j->reply_len) {
		reply = malloc(j->reply_len);
		if (reply) {
			memcpy(reply, j->reply, j->reply_len);
			len = j->reply_len;
		}
	}
	pthread_mutex_lock(&r->lock);
	w = e->waiters;
	e->waiters = NULL;
	if (!job_had_effect(j, rc)) {
		free(reply);
		if (w) {
			/* Refused before it ran, or stopped before it changed
			 * anything: the first duplicate runs in its place, the
			 * others wait on that one. */
			e->waiters = w->next;
			w->finish_hook = on_finish;
			w->finish_ctx = e;
			pthread_mutex_unlock(&r->lock);
			r->requeue(r->requeue_ctx, w);
			return;
		}
		/* Nothing applied and nobody waiting: a retry must run. */
		unlink_entry(r, e);
		pthread_mutex_unlock(&r->lock);
		free(e);
		return;
	}
	e->done = true;
	e->r = rc;
	e->err = copy;
	e->reply = reply;
	e->reply_len = len;
	e->evicted = rc == 0 && j->reply_len && !reply;  /* no memory to keep it */
	r->bytes += (int64_t)len;
	if (rc == 0)
		set_last(r, e);
	/* The waiters are answered from this copy: the bounds may drop it. */
	for (; w; w = next) {
		next = w->next;
		pthread_mutex_unlock(&r->lock);
		answer(w, rc, &copy, j->reply, j->reply_len, false);
		pthread_mutex_lock(&r->lock);
	}
	enforce_bounds(r);
	pthread_mutex_unlock(&r->lock);
}

static bool id_ok(const char *id)
{
	if (!id[0])
		return false;
	for (const char *p = id; *p; p++)
		if (*p < 0x21 || *p > 0x7e)
			return false;
	return true;
}

int replay_begin(struct replay *r, struct job *j, const uint8_t *req, size_t len,
		 enum replay_verdict *ret, struct eng_error *err)
{
	const char *id = rpc_call_request_id(j->call);
	const char *scope = job_adapter(j);
	int count = rpc_call_request_id_count(j->call);
	struct entry *e;
	uint64_t h;
	int rc;
	struct eng_error copy;
	uint8_t *reply = NULL;
	size_t rlen = 0, stored_len;
	bool evicted;

	*ret = REPLAY_RUN;
	if (!j->m || !(j->m->flags & M_REPLAY) || count == 0)
		return 0;
	if (count > 1)
		return eng_fail(err, -EINVAL, "engined-request-id: more than one header");
	if (!id || !id_ok(id))
		return eng_fail(err, -EINVAL,
				"engined-request-id: 1 to %d printable ASCII characters, no spaces",
				RPC_REQUEST_ID_MAX);
	if (strlen(scope) > ENGINE_ADAPTER_NAME_MAX)  /* the dispatcher refused it */
		return eng_fail(err, -EINVAL, "adapter: longer than %d characters",
				ENGINE_ADAPTER_NAME_MAX);
	h = XXH64(req, len, (uint64_t)j->m->id);
	pthread_mutex_lock(&r->lock);
	e = find(r, scope, id);
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&r->lock);
			return eng_fail(err, -ENOMEM, "replay: out of memory");
		}
		snprintf(e->id, sizeof(e->id), "%s", id);
		snprintf(e->scope, sizeof(e->scope), "%s", scope);
		e->owner = r;
		e->method = j->m->id;
		e->hash = h;
		e->hnext = *slot(r, id);
		*slot(r, id) = e;
		e->older = r->newest;
		if (r->newest)
			r->newest->newer = e;
		else
			r->oldest = e;
		r->newest = e;
		r->n++;
		enforce_bounds(r);
		pthread_mutex_unlock(&r->lock);
		j->finish_hook = on_finish;
		j->finish_ctx = e;
		return 0;
	}
	if (e->method != j->m->id || e->hash != h) {
		pthread_mutex_unlock(&r->lock);
		return eng_fail(err, -EINVAL,
				"engined-request-id: '%s' was used for another request (an id "
				"names one call: its retries must resend the same request)", id);
	}
	*ret = REPLAY_ANSWERED;
	if (!e->done) {
		j->next = e->waiters;
		e->waiters = j;
		pthread_mutex_unlock(&r->lock);
		return 0;
	}
	rc = e->r;
	copy = e->err;
	evicted = e->evicted;
	stored_len = e->reply_len;
	if (e->reply) {
		reply = malloc(e->reply_len);
		if (reply) {
			memcpy(reply, e->reply, e->reply_len);
			rlen = e->reply_len;
		}
	}
	pthread_mutex_unlock(&r->lock);
	if (stored_len && !reply && !evicted) {
		*ret = REPLAY_RUN;
		return eng_fail(err, -ENOMEM, "replay: out of memory");
	}
	answer(j, rc, &copy, reply, rlen, evicted);
	free(reply);
	return 0;
}

void replay_last_applied(struct replay *r, const char *scope, char *buf, size_t len)
{
	const struct scope_last *row;

	pthread_mutex_lock(&r->lock);
	row = scope[0] ? scope_row(r, scope, false) : NULL;
	snprintf(buf, len, "%s", !scope[0] ? r->last : row ? row->id : "");
	pthread_mutex_unlock(&r->lock);
}

void replay_forget_scope(struct replay *r, const char *scope)
{
	struct scope_last *row;

	pthread_mutex_lock(&r->lock);
	row = scope_row(r, scope, false);
	if (row)
		*row = r->scopes[--r->n_scopes];
	pthread_mutex_unlock(&r->lock);
}

void replay_usage(struct replay *r, int64_t *ret_entries, int64_t *ret_bytes)
{
	pthread_mutex_lock(&r->lock);
	*ret_entries = r->n;
	*ret_bytes = r->bytes;
	pthread_mutex_unlock(&r->lock);
}
