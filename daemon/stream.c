/* stream.c — GetPerTensorParam: the parameters as a stream of ParamBucket
 * messages, run as an engine job (so the parameters cannot change while it
 * runs).
 *
 * Buckets: tensors are laid end to end in `bucket_bytes` of data per message;
 * many small tensors share one, a large one is split (TensorSlice says where
 * each piece goes). Each message goes out as gRPC slices: a small
 * hand-encoded header (the ParamBucket's slices and `last`, then the tag and
 * length of `data` — field order does not matter in protobuf) followed by
 * the data itself, zero-copy: FLOAT32 pieces point straight at the engine's
 * host parameters, BFLOAT16 / FLOAT16 are converted into pool buffers. One
 * send is in flight; the next bucket is built while it travels. gRPC may
 * hold data slices after a send completes: engine memory is accounted in
 * d->zc_outstanding (jobs that change parameters wait for it to drain), pool
 * buffers return to their pool from the slice's release callback.
 */
#include "daemon.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engined/v1/engine.pb-c.h"
#include "io/safetensors.h"
#include "log.h"

#define POOL_BUFS 3
#define DEFAULT_BUCKET_BYTES (4 << 20)
#define MIN_BUCKET_BYTES 1024

struct stream_pool;

struct pool_buf {
	struct stream_pool *pool;
	uint8_t *data;                  /* [bucket_bytes] */
	bool in_use;
};

/* Shared between the job and gRPC's release callbacks; freed by whoever
 * drops the last reference. */
struct stream_pool {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int refs;                       /* job + buffers in use */
	struct pool_buf bufs[POOL_BUFS];
};

struct slice_meta {
	Engined__V1__TensorSlice msg;
	int64_t shape[4];
};

struct bucket {
	struct slice_meta *meta;        /* [cap] */
	Engined__V1__TensorSlice **ptrs;
	size_t n, cap;
	struct rpc_piece *pieces;       /* [1 + cap]: header, then data */
	int n_pieces;
	int64_t data_len;
	struct pool_buf *buf;           /* converted data, or NULL */
};

struct stream_ctx {
	struct daemon *d;
	struct rpc_call *call;
	Engined__V1__DType dtype;
	size_t esz;
	int64_t bucket_bytes;
	struct stream_pool *pool;
	struct bucket b;
	bool sending;                   /* a send is in flight */
	int64_t messages, bytes;
};

/* --- validation ---------------------------------------------------------- */

int h_validate_get_params(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__GetPerTensorParamRequest *q = (const void *)j->req;
	int64_t max = d->cfg.max_send_bytes - (1 << 20);

	if (q->dtype != ENGINED__V1__DTYPE__DTYPE_UNSPECIFIED &&
	    q->dtype != ENGINED__V1__DTYPE__FLOAT32 &&
	    q->dtype != ENGINED__V1__DTYPE__BFLOAT16 &&
	    q->dtype != ENGINED__V1__DTYPE__FLOAT16)
		return eng_fail(err, -EINVAL,
				"dtype: %d not supported (FLOAT32, BFLOAT16, FLOAT16)",
				(int)q->dtype);
	if (q->bucket_bytes != 0 &&
	    (q->bucket_bytes < MIN_BUCKET_BYTES || q->bucket_bytes > max))
		return eng_fail(err, -EINVAL, "bucket_bytes: %lld not in [%d, %lld]",
				(long long)q->bucket_bytes, MIN_BUCKET_BYTES, (long long)max);
	for (size_t i = 0; i < q->n_names; i++)
		if (!q->names[i][0])
			return eng_fail(err, -EINVAL, "names[%zu]: empty name", i);
	return 0;
}

/* --- release callbacks (any thread) -------------------------------------- */

static void pool_unref_locked(struct stream_pool *p)
{
	bool last = --p->refs == 0;

	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	if (!last)
		return;
	for (int i = 0; i < POOL_BUFS; i++)
		free(p->bufs[i].data);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

static void pool_buf_release(void *user)
{
	struct pool_buf *b = user;
	struct stream_pool *p = b->pool;

	pthread_mutex_lock(&p->lock);
	b->in_use = false;
	pool_unref_locked(p);
}

static void engine_mem_release(void *user)
{
	struct daemon *d = user;

	pthread_mutex_lock(&d->zc_lock);
	if (--d->zc_outstanding == 0)
		pthread_cond_broadcast(&d->zc_cond);
	pthread_mutex_unlock(&d->zc_lock);
}

static void header_release(void *user)
{
	free(user);
}

void stream_wait_released(struct daemon *d)
{
	struct timespec until;
	int waited = 0;

	pthread_mutex_lock(&d->zc_lock);
	while (d->zc_outstanding > 0 && waited < 30) {
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 1;
		if (pthread_cond_timedwait(&d->zc_cond, &d->zc_lock, &until) == ETIMEDOUT)
			waited++;
	}
	if (d->zc_outstanding > 0)
		log_msg(LOG_LVL_ERROR,
			"stream: gRPC still holds %lld parameter slices after 30 s",
			(long long)d->zc_outstanding);
	pthread_mutex_unlock(&d->zc_lock);
}

/* --- pool ---------------------------------------------------------------- */

static struct stream_pool *pool_new(void)
{
	struct stream_pool *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->refs = 1;
	for (int i = 0; i < POOL_BUFS; i++)
		p->bufs[i].pool = p;
	return p;
}

/* Take a free buffer (allocated on first use); waits for gRPC to release
 * one, giving up when the call ends. */
static int pool_acquire(struct stream_ctx *s, struct pool_buf **ret)
{
	struct stream_pool *p = s->pool;
	struct timespec until;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		for (int i = 0; i < POOL_BUFS; i++) {
			struct pool_buf *b = &p->bufs[i];

			if (b->in_use)
				continue;
			if (!b->data) {
				b->data = malloc((size_t)s->bucket_bytes);
				if (!b->data) {
					pthread_mutex_unlock(&p->lock);
					return -ENOMEM;
				}
			}
			b->in_use = true;
			p->refs++;
			pthread_mutex_unlock(&p->lock);
			*ret = b;
			return 0;
		}
		if (rpc_call_cancelled(s->call)) {
			pthread_mutex_unlock(&p->lock);
			return -ECANCELED;
		}
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 50 * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&p->cond, &p->lock, &until);
	}
}

/* --- conversion ---------------------------------------------------------- */

/* fp32 -> bf16, round to nearest even, NaN quiet: the rule of
 * f32_to_bf16() (engines/io/convert.c) written as a loop the compiler
 * vectorizes; the integration tests check it against torch. */
static void to_bf16(uint16_t *dst, const float *src, int64_t n)
{
	const uint32_t *u = (const uint32_t *)src;

	for (int64_t i = 0; i < n; i++) {
		uint32_t f = u[i];
		uint32_t r = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
		uint32_t q = (f >> 16) | 0x0040u;

		dst[i] = (uint16_t)((f & 0x7fffffffu) > 0x7f800000u ? q : r);
	}
}

static void to_f16(uint16_t *dst, const float *src, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = f32_to_f16(src[i]);
}

/* --- buckets ------------------------------------------------------------- */

static void bucket_release_pieces(struct bucket *b)
{
	for (int i = 1; i <= b->n_pieces; i++)
		if (b->pieces[i].release)
			b->pieces[i].release(b->pieces[i].user);
	b->n_pieces = 0;
	b->n = 0;
	if (b->buf) {
		pool_buf_release(b->buf);
		b->buf = NULL;
	}
}

static int bucket_reserve(struct bucket *b)
{
	size_t cap;
	struct slice_meta *m;
	Engined__V1__TensorSlice **p;
	struct rpc_piece *pc;

	if (b->n < b->cap)
		return 0;
	cap = b->cap ? b->cap * 2 : 16;
	m = realloc(b->meta, cap * sizeof(*m));
	if (!m)
		return -ENOMEM;
	b->meta = m;
	p = realloc(b->ptrs, cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	b->ptrs = p;
	pc = realloc(b->pieces, (cap + 2) * sizeof(*pc));
	if (!pc)
		return -ENOMEM;
	b->pieces = pc;
	b->cap = cap;
	return 0;
}

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

/* Send the bucket built so far (after the previous send completed) and
 * start an empty one. */
static int bucket_flush(struct stream_ctx *s, bool last, struct eng_error *err)
{
	struct bucket *b = &s->b;
	Engined__V1__ParamBucket msg = ENGINED__V1__PARAM_BUCKET__INIT;
	struct rpc_piece *pieces;
	size_t hlen, n;
	uint8_t *hdr;
	int r, np;

	for (size_t i = 0; i < b->n; i++) {
		b->ptrs[i] = &b->meta[i].msg;
		b->meta[i].msg.shape = b->meta[i].shape;
	}
	msg.n_slices = b->n;
	msg.slices = b->ptrs;
	msg.last = last;
	hlen = protobuf_c_message_get_packed_size(&msg.base);
	hdr = malloc(hlen + 16);
	if (!hdr) {
		bucket_release_pieces(b);
		return eng_fail(err, -ENOMEM, "out of memory for a bucket header");
	}
	protobuf_c_message_pack(&msg.base, hdr);
	n = hlen;
	if (b->data_len > 0) {
		hdr[n++] = (2 << 3) | 2;    /* field 2 (data), length-delimited */
		n += put_varint(hdr + n, (uint64_t)b->data_len);
	}

	/* pieces[0] is reserved for the header; data pieces follow. */
	pieces = b->pieces;
	pieces[0] = (struct rpc_piece){ hdr, n, header_release, hdr };
	np = 1 + b->n_pieces;
	if (b->buf) {
		pieces[np++] = (struct rpc_piece){ b->buf->data, (size_t)b->data_len,
						   pool_buf_release, b->buf };
		b->buf = NULL;
	}
	b->n_pieces = 0;
	b->n = 0;
	s->bytes += b->data_len;
	b->data_len = 0;

	if (s->sending) {
		r = rpc_stream_wait(s->call);
		s->sending = false;
		if (r < 0) {
			for (int i = 0; i < np; i++)
				if (pieces[i].release)
					pieces[i].release(pieces[i].user);
			return eng_fail(err, r, "stream: client went away (cancelled or deadline)");
		}
	}
	r = rpc_stream_send(s->call, pieces, np);
	if (r < 0)
		return eng_fail(err, r, "stream: client went away (cancelled or deadline)");
	s->sending = true;
	s->messages++;
	return 0;
}

/* Add bytes [off, off + take) of tensor v (in the target dtype). */
static int bucket_add(struct stream_ctx *s, const struct engine_param_view *v,
		      int64_t tbytes, int64_t off, int64_t take, struct eng_error *err)
{
	struct bucket *b = &s->b;
	struct slice_meta *m;
	int r;

	if (bucket_reserve(b) < 0)
		return eng_fail(err, -ENOMEM, "out of memory for bucket slices");
	m = &b->meta[b->n++];
	engined__v1__tensor_slice__init(&m->msg);
	m->msg.name = (char *)v->name;
	m->msg.dtype = s->dtype;
	m->msg.n_shape = (size_t)v->ndim;
	for (int k = 0; k < v->ndim && k < 4; k++)
		m->shape[k] = v->shape[k];
	m->msg.tensor_bytes = tbytes;
	m->msg.tensor_offset = off;
	m->msg.data_offset = b->data_len;
	m->msg.length = take;

	if (s->esz == 4) {
		/* Zero-copy: the slice points at the engine's parameter. */
		pthread_mutex_lock(&s->d->zc_lock);
		s->d->zc_outstanding++;
		pthread_mutex_unlock(&s->d->zc_lock);
		b->pieces[1 + b->n_pieces++] = (struct rpc_piece){
			(const uint8_t *)v->host_data + off, (size_t)take,
			engine_mem_release, s->d };
	} else {
		const float *src = v->host_data + off / (int64_t)s->esz;
		uint16_t *dst;

		if (!b->buf) {
			r = pool_acquire(s, &b->buf);
			if (r < 0)
				return eng_fail(err, r, r == -ENOMEM ?
						"out of memory for a stream buffer" :
						"stream: client went away (cancelled or deadline)");
		}
		dst = (uint16_t *)(b->buf->data + b->data_len);
		if (s->dtype == ENGINED__V1__DTYPE__BFLOAT16)
			to_bf16(dst, src, take / 2);
		else
			to_f16(dst, src, take / 2);
	}
	b->data_len += take;
	return 0;
}

static int find_param(struct engine *e, int64_t n, const char *name, int64_t *ret,
		      struct eng_error *err)
{
	struct engine_param_view v;

	for (int64_t i = 0; i < n; i++) {
		int r = engine_param(e, i, &v, err);

		if (r < 0)
			return r;
		if (strcmp(v.name, name) == 0) {
			*ret = i;
			return 0;
		}
	}
	return -ENOENT;
}

int h_run_get_params(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__GetPerTensorParamRequest *q = (const void *)j->req;
	struct stream_ctx s;
	int64_t n = engine_num_params(d->engine), count;
	int64_t *sel = NULL;
	int r = 0;

	memset(&s, 0, sizeof(s));
	s.d = d;
	s.call = j->call;
	s.dtype = q->dtype == ENGINED__V1__DTYPE__DTYPE_UNSPECIFIED ?
		  ENGINED__V1__DTYPE__FLOAT32 : q->dtype;
	s.esz = s.dtype == ENGINED__V1__DTYPE__FLOAT32 ? 4 : 2;
	s.bucket_bytes = (q->bucket_bytes ? q->bucket_bytes : DEFAULT_BUCKET_BYTES) & ~(int64_t)3;

	count = q->n_names ? (int64_t)q->n_names : n;
	sel = malloc((size_t)(count ? count : 1) * sizeof(*sel));
	if (!sel)
		return eng_fail(err, -ENOMEM, "out of memory");
	for (int64_t i = 0; i < count; i++) {
		if (!q->n_names) {
			sel[i] = i;
			continue;
		}
		r = find_param(d->engine, n, q->names[i], &sel[i], err);
		if (r == -ENOENT)
			r = eng_fail(err, -ENOENT, "names[%lld]: no parameter '%s'",
				     (long long)i, q->names[i]);
		if (r < 0)
			goto out;
	}
	if (s.esz != 4) {
		s.pool = pool_new();
		if (!s.pool) {
			r = eng_fail(err, -ENOMEM, "out of memory");
			goto out;
		}
	}
	if (bucket_reserve(&s.b) < 0) {
		r = eng_fail(err, -ENOMEM, "out of memory");
		goto out;
	}

	for (int64_t k = 0; k < count && r == 0; k++) {
		struct engine_param_view v;
		int64_t tbytes, off = 0;

		r = engine_param(d->engine, sel[k], &v, err);
		if (r < 0)
			break;
		tbytes = v.numel * (int64_t)s.esz;
		while (off < tbytes || (tbytes == 0 && off == 0)) {
			int64_t take;

			if (s.b.data_len == s.bucket_bytes) {
				r = bucket_flush(&s, false, err);
				if (r < 0)
					break;
			}
			take = s.bucket_bytes - s.b.data_len;
			if (take > tbytes - off)
				take = tbytes - off;
			r = bucket_add(&s, &v, tbytes, off, take, err);
			if (r < 0 || tbytes == 0)
				break;
			off += take;
		}
	}
	if (r == 0)
		r = bucket_flush(&s, true, err);
	else
		bucket_release_pieces(&s.b);
	if (s.sending && rpc_stream_wait(j->call) < 0 && r == 0)
		r = eng_fail(err, -ECANCELED, "stream: client went away (cancelled or deadline)");
	if (r == 0)
		log_msg(LOG_LVL_DEBUG, "stream: %lld tensors, %lld messages, %lld bytes",
			(long long)count, (long long)s.messages, (long long)s.bytes);
out:
	free(sel);
	free(s.b.meta);
	free(s.b.ptrs);
	free(s.b.pieces);
	if (s.pool) {
		pthread_mutex_lock(&s.pool->lock);
		pool_unref_locked(s.pool);
	}
	return r;
}
