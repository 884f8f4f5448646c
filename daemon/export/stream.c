/* stream.c — GetPerTensorParam: the parameters as a stream of ParamBucket
 * messages, run as an engine job (so the parameters cannot change while it
 * runs: the job joins every thread it starts before it returns, and gRPC's
 * late hold on engine memory is waited for by the engine thread).
 *
 * Buckets: tensors are laid end to end in `bucket_bytes` of data per message;
 * many small tensors share one, a large one is split (TensorSlice says where
 * each piece goes). Each message goes out as gRPC slices: a small header
 * (the ParamBucket's slices and `last`, then the tag and length of `data` —
 * field order does not matter in protobuf) followed by the data itself, which
 * is never copied by gRPC:
 *   - FLOAT32 from host memory (the cpu device), and BFLOAT16 from the
 *     engine's bf16 copy of its parameters (bf16 matmuls keep it; an fp32
 *     engine makes it at the first BFLOAT16 export of at least half of
 *     its parameters and keeps it from then on: params_use_bf16_copy):
 *     the data slices point at the engine's parameters or that copy
 *     (zero-copy). gRPC may hold them after a send completes: they are
 *     counted in d->zc_outstanding, and jobs that change parameters wait
 *     for it to drain (daemon_wait_engine_mem, lent.c).
 *   - FLOAT16, and BFLOAT16 of fewer tensors, from host memory: converted
 *     into a ring of bucket buffers by worker threads running ahead of the
 *     send, so that converting bucket k+1.. overlaps sending bucket k. The
 *     conversion reads the fp32 parameters once from DRAM and is bound by
 *     it; it prefetches ahead because the hardware prefetcher stops at
 *     each 4 KiB page.
 *   - any dtype from another device (cuda): the engine thread has the
 *     device convert and copy each slice into the ring (engine_param_copy),
 *     bucket k+1 while bucket k travels.
 * A ring buffer goes back to the ring from its slice's release callback
 * (not from the send completion: gRPC may still be writing it).
 *
 * A ZeRO-3 group (dist.zero_stage 3) holds no whole tensor on any rank:
 * the slices come through engine_param_copy, which gathers each tensor from
 * every rank once; the other ranks make the same request with gather_only
 * and take part in the gathers only (params_take_part), after the ranks
 * agree that all can go on (params_export_agree).
 *
 * Threads: the engine thread plans nothing itself when there are workers;
 * it takes ready buckets in order, waits for the previous send (one in
 * flight, the flow control of docs/GRPC_NOTES.md) and starts the next. Workers claim
 * bucket numbers in order under the ring lock, plan the bucket (which
 * tensor pieces go where), then convert and encode the header unlocked.
 * Lock order: gRPC releases slices (slot_release) under a call's lock, so
 * nothing calls into rpc.h with the ring lock held.
 */
#include "export.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engined/v1/engine.pb-c.h"
#include "log.h"
#include "params.h"
#include "test_hold.h"

#define DEFAULT_BUCKET_BYTES (4 << 20)
#define MIN_BUCKET_BYTES 1024
#define MAX_SLOTS 4
#define MAX_WORKERS (MAX_SLOTS - 2)
/* Engine-thread polling of a cancelled call while it waits for workers. */
#define WAIT_POLL_MS 50

/* Bytes [off, off + len) of tensor t, at data_off in the bucket. */
struct piece {
	int64_t t;
	int64_t off, len, data_off;
};

enum slot_state {
	SLOT_FREE,
	SLOT_FILLING,                   /* a worker (or the engine thread) owns it */
	SLOT_READY,                     /* bucket `bucket` waits to be sent */
	SLOT_LENT,                      /* its data belongs to gRPC until release */
};

struct ring;

struct slot {
	struct ring *ring;
	enum slot_state state;          /* ring lock */
	int64_t bucket;                 /* ring lock: bucket number it holds */
	bool last;
	struct piece *pieces;           /* [cap] */
	Engined__V1__TensorSlice *msgs; /* [cap], for the header */
	Engined__V1__TensorSlice **ptrs;/* [cap] */
	struct rpc_piece *out;          /* [cap + 1]: header, then zero-copy data */
	size_t n, cap;
	int64_t data_len;
	uint8_t *data;                  /* [bucket_bytes] converted data, lazily */
	uint8_t *hdr;                   /* [hdr_cap] packed header */
	size_t hdr_len, hdr_cap;
};

/* The bucket buffers: shared by the job, its workers and gRPC's release
 * callbacks; whoever drops the last reference frees it. */
struct ring {
	pthread_mutex_t lock;
	pthread_cond_t cond;            /* any slot state change, stop, error */
	int refs;                       /* the job + slots lent to gRPC */
	int n_slots;
	struct slot slots[MAX_SLOTS];
};

/* The job's state (engine thread and workers; fields marked `ring` are
 * under ring->lock). */
struct stream {
	struct daemon *d;
	struct engine *e;               /* the base model or the adapter streamed */
	struct rpc_call *call;
	struct ring *ring;
	struct param_set set;           /* the tensors, looked up once (params.h) */
	int64_t bucket_bytes;
	bool zero_copy;                 /* the set is in place (params.h) */

	int64_t cur_t, cur_off;         /* ring: the planner's position */
	int64_t next_bucket;            /* ring: next bucket number to claim */
	bool planned_all;               /* ring: the last bucket is claimed */
	bool stop;                      /* ring: workers must exit */
	struct eng_error werr;          /* ring: first worker failure */

	pthread_t workers[MAX_WORKERS];
	int n_workers;
	int64_t messages, bytes;
};

/* --- validation ---------------------------------------------------------- */

int h_validate_get_params(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__GetPerTensorParamRequest *q = (const void *)j->req;
	int64_t max = d->cfg.max_send_bytes - (1 << 20);
	int r = params_check_request(q->dtype, q->names, q->n_names, err);

	if (r < 0)
		return r;
	if (q->bucket_bytes != 0 &&
	    (q->bucket_bytes < MIN_BUCKET_BYTES || q->bucket_bytes > max))
		return eng_fail(err, -EINVAL, "bucket_bytes: %lld not in [%d, %lld]",
				(long long)q->bucket_bytes, MIN_BUCKET_BYTES, (long long)max);
	return 0;
}

/* --- release callbacks (any thread) -------------------------------------- */

static void ring_free(struct ring *g)
{
	for (int i = 0; i < g->n_slots; i++) {
		struct slot *sl = &g->slots[i];

		free(sl->pieces);
		free(sl->msgs);
		free(sl->ptrs);
		free(sl->out);
		free(sl->data);
		free(sl->hdr);
	}
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

/* Drop a reference; called with the lock held, returns with it released. */
static void ring_unref_locked(struct ring *g)
{
	bool last = --g->refs == 0;

	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	if (last)
		ring_free(g);
}

/* gRPC let go of a slot's data. */
static void slot_release(void *user)
{
	struct slot *sl = user;
	struct ring *g = sl->ring;

	pthread_mutex_lock(&g->lock);
	sl->state = SLOT_FREE;
	ring_unref_locked(g);
}

/* --- ring ---------------------------------------------------------------- */

static struct ring *ring_new(int n_slots)
{
	struct ring *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->refs = 1;
	g->n_slots = n_slots;
	for (int i = 0; i < n_slots; i++) {
		g->slots[i].ring = g;
		g->slots[i].bucket = -1;
	}
	return g;
}

static int slot_reserve(struct slot *sl)
{
	size_t cap;
	void *p;

	if (sl->n < sl->cap)
		return 0;
	cap = sl->cap ? sl->cap * 2 : 16;
	p = realloc(sl->pieces, cap * sizeof(*sl->pieces));
	if (!p)
		return -ENOMEM;
	sl->pieces = p;
	p = realloc(sl->msgs, cap * sizeof(*sl->msgs));
	if (!p)
		return -ENOMEM;
	sl->msgs = p;
	p = realloc(sl->ptrs, cap * sizeof(*sl->ptrs));
	if (!p)
		return -ENOMEM;
	sl->ptrs = p;
	p = realloc(sl->out, (cap + 1) * sizeof(*sl->out));
	if (!p)
		return -ENOMEM;
	sl->out = p;
	sl->cap = cap;
	return 0;
}

/* --- planning (ring lock held) -------------------------------------------- */

/* Claim the next bucket number for sl (which is free) and decide its
 * pieces: fill up to bucket_bytes, flushing only when more data follows,
 * so the last bucket may be full and a zero-byte tensor after a full
 * bucket opens the next one. */
static int plan_locked(struct stream *s, struct slot *sl)
{
	sl->state = SLOT_FILLING;
	sl->bucket = s->next_bucket++;
	sl->n = 0;
	sl->data_len = 0;
	while (s->cur_t < s->set.n) {
		const struct param_ref *t = &s->set.t[s->cur_t];
		int64_t take = s->bucket_bytes - sl->data_len;

		if (take == 0)
			break;
		if (take > t->bytes - s->cur_off)
			take = t->bytes - s->cur_off;
		if (slot_reserve(sl) < 0)
			return -ENOMEM;
		sl->pieces[sl->n++] = (struct piece){ s->cur_t, s->cur_off, take, sl->data_len };
		sl->data_len += take;
		s->cur_off += take;
		if (s->cur_off == t->bytes) {
			s->cur_t++;
			s->cur_off = 0;
		}
	}
	sl->last = s->cur_t == s->set.n;
	if (sl->last)
		s->planned_all = true;
	return 0;
}

/* --- filling (the slot's owner, unlocked) --------------------------------- */

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

/* The ParamBucket without its data, then data's tag and length. */
static int encode_header(const struct stream *s, struct slot *sl)
{
	Engined__V1__ParamBucket msg = ENGINED__V1__PARAM_BUCKET__INIT;
	size_t need;

	for (size_t i = 0; i < sl->n; i++) {
		const struct piece *p = &sl->pieces[i];
		const struct param_ref *t = &s->set.t[p->t];
		Engined__V1__TensorSlice *m = &sl->msgs[i];

		engined__v1__tensor_slice__init(m);
		m->name = (char *)t->name;
		m->dtype = s->set.dtype;
		m->n_shape = (size_t)t->ndim;
		m->shape = (int64_t *)t->shape;
		m->tensor_bytes = t->bytes;
		m->tensor_offset = p->off;
		m->data_offset = p->data_off;
		m->length = p->len;
		sl->ptrs[i] = m;
	}
	msg.n_slices = sl->n;
	msg.slices = sl->ptrs;
	msg.last = sl->last;
	need = protobuf_c_message_get_packed_size(&msg.base) + 16;
	if (need > sl->hdr_cap) {
		uint8_t *h = realloc(sl->hdr, need);

		if (!h)
			return -ENOMEM;
		sl->hdr = h;
		sl->hdr_cap = need;
	}
	sl->hdr_len = protobuf_c_message_pack(&msg.base, sl->hdr);
	if (sl->data_len > 0) {
		sl->hdr[sl->hdr_len++] = (2 << 3) | 2;  /* field 2 (data), length-delimited */
		sl->hdr_len += put_varint(sl->hdr + sl->hdr_len, (uint64_t)sl->data_len);
	}
	return 0;
}

/* Convert or copy the slot's pieces into its buffer and encode the header.
 * engine_param_copy (tensors without host memory) only on the engine
 * thread: such streams have no workers. */
static int fill(struct stream *s, struct slot *sl, struct eng_error *err)
{
	if (!s->zero_copy && !sl->data && sl->data_len > 0) {
		sl->data = malloc((size_t)s->bucket_bytes);
		if (!sl->data)
			return eng_fail(err, -ENOMEM, "out of memory for a stream buffer");
	}
	for (size_t i = 0; i < sl->n && !s->zero_copy; i++) {
		const struct piece *p = &sl->pieces[i];
		const struct param_ref *t = &s->set.t[p->t];
		int64_t esz = (int64_t)s->set.esz;
		int r = params_read(s->e, &s->set, t, p->off / esz, p->len / esz,
				    sl->data + p->data_off, err);

		if (r < 0)
			return r;
	}
	if (encode_header(s, sl) < 0)
		return eng_fail(err, -ENOMEM, "out of memory for a bucket header");
	return 0;
}

/* --- workers --------------------------------------------------------------- */

static void *worker_main(void *arg)
{
	struct stream *s = arg;
	struct ring *g = s->ring;
	struct eng_error e;

	pthread_mutex_lock(&g->lock);
	while (!s->stop && !s->planned_all) {
		struct slot *sl = &g->slots[s->next_bucket % g->n_slots];
		int r;

		if (sl->state != SLOT_FREE) {
			pthread_cond_wait(&g->cond, &g->lock);
			continue;
		}
		eng_error_clear(&e);
		r = plan_locked(s, sl);
		if (r < 0)
			eng_fail(&e, r, "out of memory for bucket slices");
		pthread_mutex_unlock(&g->lock);
		if (r == 0)
			r = fill(s, sl, &e);
		pthread_mutex_lock(&g->lock);
		if (r < 0) {
			if (!s->werr.code)
				s->werr = e;
			s->stop = true;
			pthread_cond_broadcast(&g->cond);
			break;
		}
		sl->state = SLOT_READY;
		pthread_cond_broadcast(&g->cond);
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

/* Workers for host conversions. One converts ~6 GB/s of bf16 on these
 * machines, more than one connection carries, and the send path (engine
 * thread, gRPC's pollers, on loopback the client) needs cores too: half of
 * the engine's threads (main.c resolves 0 to the CPU budget), at least one, and no more
 * than leaves a ring slot in gRPC's hands and one ready. */
static int worker_count(const struct stream *s)
{
	long n = s->d->cfg.threads > 0 ? s->d->cfg.threads : sysconf(_SC_NPROCESSORS_ONLN);

	if (s->zero_copy || !s->set.n || !s->set.on_host)
		return 0;
	n /= 2;
	if (n > s->ring->n_slots - 2)
		n = s->ring->n_slots - 2;
	return n < 1 ? 1 : (int)n;
}

static void stop_workers(struct stream *s)
{
	pthread_mutex_lock(&s->ring->lock);
	s->stop = true;
	pthread_cond_broadcast(&s->ring->cond);
	pthread_mutex_unlock(&s->ring->lock);
	for (int i = 0; i < s->n_workers; i++)
		pthread_join(s->workers[i], NULL);
	s->n_workers = 0;
}

/* --- sending (engine thread) ---------------------------------------------- */

static int call_gone(struct eng_error *err)
{
	return eng_fail(err, -ECANCELED, "stream: client went away (cancelled or deadline)");
}

static bool stream_gone(void *call)
{
	return rpc_call_cancelled(call);
}

static bool slot_is(const struct slot *sl, enum slot_state want, int64_t k)
{
	return want == SLOT_READY ? sl->state == SLOT_READY && sl->bucket == k :
	       sl->state == SLOT_FREE;
}

/* Wait until sl is in state `want` holding bucket k (want READY), or is
 * free (want FREE); gives up on a worker's failure or a cancelled call.
 * The call's state is read without the ring lock held (lock order: gRPC
 * releases slices, slot_release, under the call's lock). */
static int wait_slot(struct stream *s, struct slot *sl, enum slot_state want, int64_t k,
		     struct eng_error *err)
{
	struct ring *g = s->ring;
	struct timespec until;
	bool done;

	for (;;) {
		pthread_mutex_lock(&g->lock);
		if (!slot_is(sl, want, k) && !s->werr.code) {
			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_nsec += WAIT_POLL_MS * 1000000L;
			if (until.tv_nsec >= 1000000000L) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&g->cond, &g->lock, &until);
		}
		done = slot_is(sl, want, k);
		if (!done && s->werr.code) {
			*err = s->werr;
			pthread_mutex_unlock(&g->lock);
			return err->code;
		}
		pthread_mutex_unlock(&g->lock);
		if (done)
			return 0;
		if (rpc_call_cancelled(s->call))
			return call_gone(err);
	}
}

/* Without workers: plan and fill bucket k on this thread. */
static int produce_inline(struct stream *s, int64_t k, struct eng_error *err)
{
	struct ring *g = s->ring;
	struct slot *sl = &g->slots[k % g->n_slots];
	int r = wait_slot(s, sl, SLOT_FREE, k, err);

	if (r < 0)
		return r;
	pthread_mutex_lock(&g->lock);
	r = plan_locked(s, sl);
	pthread_mutex_unlock(&g->lock);
	if (r < 0)
		return eng_fail(err, r, "out of memory for bucket slices");
	r = fill(s, sl, err);
	pthread_mutex_lock(&g->lock);
	sl->state = r < 0 ? SLOT_FREE : SLOT_READY;
	pthread_mutex_unlock(&g->lock);
	return r;
}

/* Hand bucket sl to gRPC (no send in flight). The header is copied by
 * rpc_stream_send; the data is lent: the ring buffer until slot_release,
 * or (zero-copy) the engine's memory, counted in d->zc_outstanding. */
static int send_slot(struct stream *s, struct slot *sl, struct eng_error *err)
{
	struct ring *g = s->ring;
	struct rpc_piece *out = sl->out;
	int n = 1, r;

	out[0] = (struct rpc_piece){ sl->hdr, sl->hdr_len, NULL, NULL };
	if (s->zero_copy) {
		struct daemon *d = s->d;

		daemon_lend_engine_mem(d, (int64_t)sl->n);
		for (size_t i = 0; i < sl->n; i++) {
			const struct piece *p = &sl->pieces[i];

			out[n++] = (struct rpc_piece){
				(const uint8_t *)s->set.t[p->t].data + p->off,
				(size_t)p->len, daemon_engine_mem_released, d };
		}
	} else if (sl->data_len > 0) {
		pthread_mutex_lock(&g->lock);
		sl->state = SLOT_LENT;
		g->refs++;
		pthread_mutex_unlock(&g->lock);
		out[n++] = (struct rpc_piece){ sl->data, (size_t)sl->data_len, slot_release, sl };
	}
	s->bytes += sl->data_len;
	daemon_progress(s->d, "send", s->bytes, s->set.total_bytes, "bytes");
	r = rpc_stream_send(s->call, out, n);
	if (n == 1 || s->zero_copy) {
		/* Nothing of the slot is lent (its `out` was read until now). */
		pthread_mutex_lock(&g->lock);
		sl->state = SLOT_FREE;
		pthread_cond_broadcast(&g->cond);
		pthread_mutex_unlock(&g->lock);
	}
	if (r < 0)
		return call_gone(err);
	s->messages++;
	return 0;
}

static int run_stream(struct stream *s, struct eng_error *err)
{
	struct ring *g = s->ring;
	bool sending = false;
	int r = 0;

	for (int64_t k = 0;; k++) {
		struct slot *sl = &g->slots[k % g->n_slots];
		bool last;

		if (!s->n_workers) {
			r = produce_inline(s, k, err);
			if (r < 0)
				break;
		}
		r = wait_slot(s, sl, SLOT_READY, k, err);
		if (r < 0)
			break;
		last = sl->last;
		if (sending) {
			sending = false;
			if (rpc_stream_wait(s->call) < 0) {
				r = call_gone(err);
				break;
			}
		}
		if (k > 0)      /* the test hook's safe point between messages */
			test_hold_safe_point(stream_gone, s->call);
		r = send_slot(s, sl, err);
		if (r < 0)
			break;
		sending = true;
		if (last)
			break;
	}
	stop_workers(s);
	if (sending && rpc_stream_wait(s->call) < 0 && r == 0)
		r = call_gone(err);
	return r;
}

/* --- the job --------------------------------------------------------------- */

int h_run_get_params(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__GetPerTensorParamRequest *q = (const void *)j->req;
	struct stream s;
	int r;

	memset(&s, 0, sizeof(s));
	s.d = d;
	s.call = j->call;
	/* A multiple of 4: pieces never split an element of any dtype. */
	s.bucket_bytes = (q->bucket_bytes ? q->bucket_bytes : DEFAULT_BUCKET_BYTES) & ~(int64_t)3;

	r = daemon_engine_of(d, q->adapter, &s.e, err);
	if (r == 0 && q->adapter_view && !q->adapter[0])
		r = eng_fail(err, -EINVAL, "adapter_view: needs an adapter");
	if (r == 0 && q->adapter[0])
		r = engine_adapter_set_view(s.e, (enum engine_adapter_view)q->adapter_view, err);
	if (r == 0)
		r = params_collect(s.e, q->dtype, q->names, q->n_names, false, &s.set, err);
	/* A ZeRO-3 group's ranks agree before the first gather (params.h). */
	r = params_export_agree(d->engine, q->adapter, q->adapter_view, r, "GetPerTensorParam", err);
	if (r < 0)
		goto out;
	if (q->gather_only) {   /* another rank exports; no bucket from here */
		r = params_take_part(s.e, &s.set, err);
		goto out;
	}
	if (!s.set.in_place) {
		struct eng_error why;

		r = params_use_bf16_copy(s.e, &s.set, false, NULL, &why, err);
		if (r < 0)
			goto out;
		if (why.code)
			log_msg(LOG_LVL_DEBUG, "stream: converting: %s", why.msg);
		r = 0;
	}
	s.zero_copy = s.set.in_place;
	daemon_progress(d, "send", 0, s.set.total_bytes, "bytes");
	/* Up to 4 buffers: one in gRPC's hands, one ready, the rest being
	 * converted; fewer for buckets so large that memory matters more. */
	s.ring = ring_new(s.zero_copy || s.bucket_bytes > (16 << 20) ? 3 : MAX_SLOTS);
	if (!s.ring) {
		r = eng_fail(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (int i = worker_count(&s); s.n_workers < i; s.n_workers++)
		if (pthread_create(&s.workers[s.n_workers], NULL, worker_main, &s) != 0)
			break;  /* fewer workers (none: the engine thread fills) */
	r = run_stream(&s, err);
	if (r == 0)
		log_msg(LOG_LVL_DEBUG, "stream: %lld tensors, %lld messages, %lld bytes of %s, %s",
			(long long)s.set.n, (long long)s.messages, (long long)s.bytes,
			protobuf_c_enum_descriptor_get_value(&engined__v1__dtype__descriptor,
							     s.set.dtype)->name,
			s.zero_copy ? "sent in place" : "converted or copied");
out:
	params_set_free(&s.set);
	if (s.ring) {
		pthread_mutex_lock(&s.ring->lock);
		ring_unref_locked(s.ring);
	}
	return r;
}
