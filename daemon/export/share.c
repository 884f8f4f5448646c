/* share.c — ShareWeights: the parameters in a sealed memfd for a consumer
 * on this host, run as an engine job (so they cannot change while it
 * copies), handed out over the share socket (share_socket.h) under a handle
 * of the share table (share_table.h).
 *
 * Layout: the tensors asked for, in order, each at a multiple of 64 bytes
 * (SHARE_ALIGN), the gaps zero; the file ends with the last tensor. Every
 * size is checked arithmetic (names and dtype come from the client).
 *
 * Filling: the file is written with pwrite(), never mapped here: tmpfs then
 * allocates each page without zeroing it first (a mapping's first touch
 * clears it, one more pass over the memory: measured 3.0 against 1.5-2.0
 * GB/s into fresh pages on these machines, docs/PERF.md), and with no
 * writable mapping left F_SEAL_WRITE is always accepted. The work is cut
 * into units of SHARE_UNIT_BYTES of the file: FLOAT32 from host memory is
 * one pwrite per unit straight from the engine's parameters on the engine
 * thread (tmpfs serializes writes to one file: more threads would wait);
 * BFLOAT16 / FLOAT16 from host memory are converted by the engine's threads
 * (the engine thread and workers, each into its own unit buffer) with the
 * stream's conversion (params.h), then written; tensors in device memory
 * come through engine_param_copy on the engine thread. Then the file is
 * sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) and
 * given to the table; the reply carries the handle and the index.
 *
 * The job polls its call between units: a client that went away stops it
 * (CANCELLED) and the memory is freed at once.
 *
 * Without a copy (lend): BFLOAT16 of parameters in host memory, when the
 * tensors asked for are at least half of all the parameters, is the
 * engine's own bf16 copy lent as it is (engine_lend_params_bf16: the file
 * the engine's products read, sealed the same way; made current first in
 * an fp32 engine, which keeps it current from then on). The reply's
 * offsets are the tensors' places in that file, which holds every
 * parameter; the file is never written again (the engine's next values go
 * to a new one), so the consumer's view cannot change under it. Below
 * half, the tensors are copied as above: a consumer of a few tensors
 * should not keep every parameter's memory alive after the engine moved
 * on. An engine that cannot lend (device memory, no such copy) copies, and
 * so does one whose copy holds a tensor asked for at an offset that is not
 * a multiple of SHARE_ALIGN (odd model sizes: the reply promises it).
 *
 * A ZeRO-3 group (dist.zero_stage 3): no rank holds whole parameters, so
 * the copy reads each tensor gathered from every rank (engine_param_copy
 * gathers a tensor once and serves its units from the gathered copy); the
 * other ranks make the same request with gather_only and only take part in
 * the gathers (params_take_part), writing nothing.
 */
#include "export.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "checked.h"
#include "clock.h"
#include "engined/v1/engine.pb-c.h"
#include "log.h"
#include "params.h"

#define SHARE_ALIGN 64
#define SHARE_UNIT_BYTES (1 << 20)
#define MAX_SHARE_WORKERS 16
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)

/* Bytes [off, off + len) of tensor t, at file_off in the file. */
struct unit {
	int64_t t;
	int64_t off, len, file_off;
};

struct share_job {
	struct daemon *d;
	struct engine *e;               /* the base model or the adapter shared */
	struct param_set set;
	int64_t *offsets;               /* [set.n] in the file */
	int64_t total;                  /* the file's size */
	struct unit *units;
	int64_t n_units;
	int fd;

	int64_t next;                   /* atomic: the next unit to claim */
	int64_t done;                   /* atomic: bytes written */
	bool stop;                      /* atomic */
	pthread_mutex_t lock;
	struct eng_error werr;          /* lock: a worker's first failure */
	pthread_t workers[MAX_SHARE_WORKERS];
	int n_workers;
};

int h_validate_share_weights(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__ShareWeightsRequest *q = (const void *)j->req;
	int r = params_check_request(q->dtype, q->names, q->n_names, err);

	(void)d;
	return r;
}

/* What a share needs besides its tensors, checked in the job (where a
 * ZeRO-3 group's ranks agree on it: share_weights_run). */
static int check_share(const struct daemon *d, const Engined__V1__ShareWeightsRequest *q,
		       struct eng_error *err)
{
	if (q->uses < 0 || q->uses > SHARE_MAX_USES)
		return eng_fail(err, -EINVAL, "uses: %d not in [0, %d] (0: 1)", (int)q->uses,
				SHARE_MAX_USES);
	if (!d->shares)
		return eng_fail(err, -EALREADY,
				"share_socket: not configured: set [server] share_socket (a unix "
				"socket path) to share weights with consumers on this host");
	return 0;
}

/* The file's layout and the units; every size checked. */
static int plan(struct share_job *s, struct eng_error *err)
{
	int64_t off = 0, n_units = 0;

	s->offsets = calloc((size_t)(s->set.n ? s->set.n : 1), sizeof(*s->offsets));
	if (!s->offsets)
		return eng_fail(err, -ENOMEM, "out of memory");
	for (int64_t i = 0; i < s->set.n; i++) {
		int64_t bytes = s->set.t[i].bytes, units;

		if (!ck_add_i64(off, SHARE_ALIGN - 1, &off))
			return eng_fail(err, -E2BIG, "share: size overflows");
		off &= ~(int64_t)(SHARE_ALIGN - 1);
		s->offsets[i] = off;
		units = bytes / SHARE_UNIT_BYTES + (bytes % SHARE_UNIT_BYTES != 0);
		if (!ck_add_i64(off, bytes, &off) || !ck_add_i64(n_units, units, &n_units))
			return eng_fail(err, -E2BIG, "share: size overflows");
	}
	s->total = off;
	s->units = calloc((size_t)(n_units ? n_units : 1), sizeof(*s->units));
	if (!s->units)
		return eng_fail(err, -ENOMEM, "out of memory for %lld share units",
				(long long)n_units);
	for (int64_t i = 0; i < s->set.n; i++)
		for (int64_t o = 0; o < s->set.t[i].bytes; o += SHARE_UNIT_BYTES) {
			int64_t len = s->set.t[i].bytes - o;

			s->units[s->n_units++] = (struct unit){
				i, o, len < SHARE_UNIT_BYTES ? len : SHARE_UNIT_BYTES,
				s->offsets[i] + o };
		}
	return 0;
}

/* All of buf at off of the file. */
static int write_all(int fd, const void *buf, int64_t len, int64_t off, struct eng_error *err)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = pwrite(fd, p, (size_t)len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return eng_fail(err, n < 0 ? eng_errno_code(errno) : -EIO,
					"share: writing the shared memory: %s",
					n < 0 ? strerror(errno) : "no progress");
		p += n;
		len -= n;
		off += n;
	}
	return 0;
}

/* One unit, through buf (SHARE_UNIT_BYTES) unless it is fp32 host memory. */
static int write_unit(struct share_job *s, const struct unit *u, uint8_t *buf,
		      struct eng_error *err)
{
	const struct param_ref *t = &s->set.t[u->t];
	int64_t esz = (int64_t)s->set.esz;
	int r;

	if (t->data)
		return write_all(s->fd, (const uint8_t *)t->data + u->off, u->len, u->file_off,
				 err);
	r = params_read(s->e, &s->set, t, u->off / esz, u->len / esz, buf, err);
	if (r < 0)
		return r;
	return write_all(s->fd, buf, u->len, u->file_off, err);
}

/* A worker: claim and write units until none is left or the job stops. */
static int drain(struct share_job *s, uint8_t *buf, struct eng_error *err)
{
	for (;;) {
		int64_t k;
		int r;

		if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED))
			return 0;
		k = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED);
		if (k >= s->n_units)
			return 0;
		r = write_unit(s, &s->units[k], buf, err);
		if (r < 0)
			return r;
		__atomic_add_fetch(&s->done, s->units[k].len, __ATOMIC_RELAXED);
	}
}

static void *worker_main(void *arg)
{
	struct share_job *s = arg;
	struct eng_error e;
	uint8_t *buf = malloc(SHARE_UNIT_BYTES);
	int r;

	eng_error_clear(&e);
	r = buf ? drain(s, buf, &e) :
	    eng_fail(&e, -ENOMEM, "out of memory for a share buffer");
	if (r < 0) {
		pthread_mutex_lock(&s->lock);
		if (!s->werr.code)
			s->werr = e;
		pthread_mutex_unlock(&s->lock);
		__atomic_store_n(&s->stop, true, __ATOMIC_RELAXED);
	}
	free(buf);
	return NULL;
}

/* Workers besides the engine thread: conversions of host memory only
 * (fp32 is one writer's work, device memory the engine thread's); all the
 * engine's threads, none of which has other work while this job runs. */
static int worker_count(const struct share_job *s)
{
	long n = s->d->cfg.threads > 0 ? s->d->cfg.threads : sysconf(_SC_NPROCESSORS_ONLN);

	if (!s->set.on_host || s->set.in_place || s->n_units < 2)
		return 0;
	if (n > MAX_SHARE_WORKERS)
		n = MAX_SHARE_WORKERS;
	if (n - 1 > s->n_units - 1)
		n = s->n_units;
	return n > 1 ? (int)n - 1 : 0;
}

/* The engine thread's part: its own units, with a look at the call
 * between them; then the workers joined and their failure taken. */
static int fill(struct share_job *s, struct rpc_call *call, struct eng_error *err)
{
	uint8_t *buf = malloc(SHARE_UNIT_BYTES);
	int r = 0;

	if (!buf)
		return eng_fail(err, -ENOMEM, "out of memory for a share buffer");
	for (int i = worker_count(s); s->n_workers < i; s->n_workers++)
		if (pthread_create(&s->workers[s->n_workers], NULL, worker_main, s) != 0)
			break;  /* fewer workers */
	for (;;) {
		int64_t k;

		if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED))
			break;
		if (rpc_call_cancelled(call)) {
			r = eng_fail(err, -ECANCELED, "share: client went away (cancelled or deadline)");
			break;
		}
		k = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED);
		if (k >= s->n_units)
			break;
		r = write_unit(s, &s->units[k], buf, err);
		if (r < 0)
			break;
		__atomic_add_fetch(&s->done, s->units[k].len, __ATOMIC_RELAXED);
		daemon_progress(s->d, "copy", __atomic_load_n(&s->done, __ATOMIC_RELAXED),
				s->total, "bytes");
	}
	if (r < 0)
		__atomic_store_n(&s->stop, true, __ATOMIC_RELAXED);
	for (int i = 0; i < s->n_workers; i++)
		pthread_join(s->workers[i], NULL);
	s->n_workers = 0;
	if (r == 0 && s->werr.code) {
		*err = s->werr;
		r = s->werr.code;
	}
	free(buf);
	return r;
}

/* Back to copying (from the copy, current now: each tensor's data): a
 * tensor of the lent copy is not at a multiple of SHARE_ALIGN (a model with
 * odd sizes), which the reply promises. */
static int unlent(struct share_job *s, const char *name)
{
	log_msg(LOG_LVL_DEBUG, "share: copying the tensors: %s is not %d-byte aligned in the "
		"engine's bf16 copy", name, SHARE_ALIGN);
	close(s->fd);
	s->fd = -1;
	free(s->offsets);
	s->offsets = NULL;
	return 0;
}

/* The lend rule (the header; params_use_bf16_copy): 1 when the share is
 * the engine's bf16 copy itself (s->fd, s->total, s->offsets and each
 * tensor's data are the lent file's), 0 when it is to be copied, < 0 on
 * failure. */
static int lend(struct share_job *s, struct eng_error *err)
{
	struct engine_lent_file f;
	struct eng_error why;
	const char *odd = NULL;
	int r;

	r = params_use_bf16_copy(s->e, &s->set, true, &f, &why, err);
	if (why.code)
		log_msg(LOG_LVL_DEBUG, "share: copying the tensors: %s", why.msg);
	if (r <= 0)
		return r;
	s->fd = f.fd;
	s->total = f.bytes;
	s->offsets = calloc((size_t)(s->set.n ? s->set.n : 1), sizeof(*s->offsets));
	if (!s->offsets)
		return eng_fail(err, -ENOMEM, "out of memory");
	for (int64_t i = 0; i < s->set.n; i++) {
		const struct param_ref *t = &s->set.t[i];
		int64_t off = ((const uint16_t *)t->data - f.base) * 2;

		if (off < 0 || off > f.bytes - t->bytes)
			return eng_fail(err, -EIO, "share: %s lies outside the lent copy", t->name);
		if (off % SHARE_ALIGN && !odd)
			odd = t->name;
		s->offsets[i] = off;
	}
	return odd ? unlent(s, odd) : 1;
}

/* The host must hold the share besides everything else. */
static int check_host_memory(int64_t total, struct eng_error *err)
{
	size_t avail = engine_host_mem_free();

	if (avail != SIZE_MAX && (uint64_t)total > (uint64_t)avail)
		return eng_fail(err, -ENOMEM,
				"share: %lld bytes of shared memory, only %zu bytes of host memory "
				"available", (long long)total, avail);
	return 0;
}

/* The copy: a new memfd filled and sealed (the header). */
static int write_file(struct share_job *s, struct rpc_call *call, struct eng_error *err)
{
	int r;

	daemon_progress(s->d, "copy", 0, s->total, "bytes");
	s->fd = memfd_create("engined-weights", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (s->fd < 0 || ftruncate(s->fd, (off_t)s->total) < 0)
		return eng_fail(err, eng_errno_code(errno), "share: memfd of %lld bytes: %s",
				(long long)s->total, strerror(errno));
	r = fill(s, call, err);
	if (r < 0)
		return r;
	if (fcntl(s->fd, F_ADD_SEALS, SEALS) < 0)
		return eng_fail(err, -EIO, "share: sealing the memfd: %s", strerror(errno));
	return 0;
}

static int reply(struct daemon *d, struct job *j, const struct share_job *s,
		 const uint8_t handle[SHARE_HANDLE_BYTES], int64_t step)
{
	Engined__V1__ShareWeightsResponse resp = ENGINED__V1__SHARE_WEIGHTS_RESPONSE__INIT;
	Engined__V1__SharedTensor *msgs = calloc((size_t)(s->set.n ? s->set.n : 1),
						 sizeof(*msgs));
	Engined__V1__SharedTensor **ptrs = calloc((size_t)(s->set.n ? s->set.n : 1),
						  sizeof(*ptrs));
	int r;

	if (!msgs || !ptrs) {
		free(msgs);
		free(ptrs);
		return -ENOMEM;
	}
	for (int64_t i = 0; i < s->set.n; i++) {
		const struct param_ref *t = &s->set.t[i];

		engined__v1__shared_tensor__init(&msgs[i]);
		msgs[i].name = (char *)t->name;
		msgs[i].dtype = s->set.dtype;
		msgs[i].n_shape = (size_t)t->ndim;
		msgs[i].shape = (int64_t *)t->shape;
		msgs[i].offset = s->offsets[i];
		msgs[i].bytes = t->bytes;
		ptrs[i] = &msgs[i];
	}
	resp.handle.data = (uint8_t *)handle;
	resp.handle.len = SHARE_HANDLE_BYTES;
	resp.total_bytes = s->total;
	resp.socket_path = d->cfg.share_socket;
	resp.n_tensors = (size_t)s->set.n;
	resp.tensors = ptrs;
	resp.expires_in_s = (double)share_table_ttl_ms(d->shares) / 1e3;
	resp.step = step;
	r = job_set_reply(j, &resp.base);
	free(msgs);
	free(ptrs);
	return r;
}

/* gather_only: no handle, the step the gathered weights are of. */
static int reply_gathered(struct job *j, struct engine *e, struct eng_error *err)
{
	Engined__V1__ShareWeightsResponse resp = ENGINED__V1__SHARE_WEIGHTS_RESPONSE__INIT;
	struct engine_status st;
	int r;

	engine_status(e, &st);
	resp.step = st.step;
	r = job_set_reply(j, &resp.base);
	return r < 0 ? eng_fail(err, r, "out of memory for the reply") : 0;
}

int h_run_share_weights(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__ShareWeightsRequest *q = (const void *)j->req;
	static const char *const dtype_names[] = { "?", "float32", "bfloat16", "float16" };
	struct share_job s;
	struct engine *e = NULL;
	struct engine_status st;
	uint8_t handle[SHARE_HANDLE_BYTES];
	uint64_t id = 0;
	double t0 = eng_now_s(), dt;
	int r, lent;

	memset(&s, 0, sizeof(s));
	s.d = d;
	s.fd = -1;
	pthread_mutex_init(&s.lock, NULL);
	r = daemon_engine_of(d, q->adapter, &e, err);
	if (r == 0 && q->adapter_view && !q->adapter[0])
		r = eng_fail(err, -EINVAL, "adapter_view: needs an adapter");
	if (r == 0 && q->adapter[0])
		r = engine_adapter_set_view(e, (enum engine_adapter_view)q->adapter_view, err);
	s.e = e;
	if (r == 0)
		r = params_collect(e, q->dtype, q->names, q->n_names, true, &s.set, err);
	if (q->gather_only) {   /* another rank shares (the header) */
		r = params_export_agree(d->engine, q->adapter, q->adapter_view, r, "ShareWeights", err);
		if (r == 0)
			r = params_take_part(e, &s.set, err);
		if (r == 0)
			r = reply_gathered(j, e, err);
		goto out;
	}
	if (r == 0)
		r = check_share(d, q, err);
	lent = r == 0 ? lend(&s, err) : 0;
	if (r == 0)
		r = lent < 0 ? lent : lent ? 0 : plan(&s, err);
	if (r == 0)
		r = share_table_admit(d->shares, s.total, share_table_now_ms(), err);
	if (r == 0 && !lent)
		r = check_host_memory(s.total, err);
	r = params_export_agree(d->engine, q->adapter, q->adapter_view, r, "ShareWeights", err);
	if (r == 0 && !lent)
		r = write_file(&s, j->call, err);
	if (r < 0)
		goto out;
	engine_status(e, &st);
	/* The table owns the descriptor from here, also when this fails. */
	r = share_table_add(d->shares, s.fd, s.total, q->uses ? q->uses : 1,
			    share_table_now_ms(), handle, &id, err);
	s.fd = -1;
	if (r < 0)
		goto out;
	dt = eng_now_s() - t0;
	log_msg(LOG_LVL_INFO,
		"share #%llu: %lld tensors, %lld bytes %s (step %lld) %s in %.3f s (%.2f GB/s), "
		"%d use%s within %.1f s", (unsigned long long)id, (long long)s.set.n,
		(long long)s.total, dtype_names[s.set.dtype], (long long)st.step,
		lent ? "lent (the engine's bf16 copy)" : "copied", dt,
		dt > 0 ? (double)s.total / dt / 1e9 : 0.0, q->uses ? q->uses : 1,
		q->uses > 1 ? "s" : "", (double)share_table_ttl_ms(d->shares) / 1e3);
	r = reply(d, j, &s, handle, st.step);
	if (r < 0)
		r = eng_fail(err, r, "out of memory for the reply");
	memset(handle, 0, sizeof(handle));
out:
	if (s.fd >= 0)
		close(s.fd);
	free(s.units);
	free(s.offsets);
	params_set_free(&s.set);
	pthread_mutex_destroy(&s.lock);
	return r;
}
