/* nccl_dist.c — the NCCL backend of dist.h: collectives over device memory
 * (the CUDA device), ordered on the stream the engine gives (cfg.stream).
 *
 * libnccl is opened with dlopen() the first time it is needed, like
 * cuBLASLt (engines/device/cuda/cuda_gemm.c), so that binaries built with
 * CUDA start on hosts without it; a missing library is -ELIBACC.
 *
 * Nothing here blocks without a bound: the communicator is non-blocking
 * (ncclConfig_t.blocking = 0), ncclCommInitRankConfig is polled with
 * ncclCommGetAsyncError until the group's timeout, and each collective is
 * enqueued on the stream and then polled (cudaStreamQuery and
 * ncclCommGetAsyncError). A timeout or an error aborts the communicator
 * (ncclCommAbort) and breaks the group: later calls return -ENOTCONN.
 * ncclRemoteError and ncclSystemError (a peer or its socket went away) are
 * -ECONNRESET; other failures -EIO with NCCL's text. The barrier is an
 * all-reduce of one float (NCCL has no barrier).
 */
#include "dist/dist.h"
#include "clock.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

/* The entry points used, resolved from libnccl. */
static struct {
	ncclResult_t (*get_unique_id)(ncclUniqueId *id);
	ncclResult_t (*init_rank_config)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
					 ncclConfig_t *config);
	ncclResult_t (*async_error)(ncclComm_t comm, ncclResult_t *res);
	ncclResult_t (*abort)(ncclComm_t comm);
	ncclResult_t (*finalize)(ncclComm_t comm);
	ncclResult_t (*destroy)(ncclComm_t comm);
	ncclResult_t (*all_reduce)(const void *s, void *r, size_t n, ncclDataType_t t,
				   ncclRedOp_t op, ncclComm_t comm, cudaStream_t st);
	ncclResult_t (*reduce_scatter)(const void *s, void *r, size_t n, ncclDataType_t t,
				       ncclRedOp_t op, ncclComm_t comm, cudaStream_t st);
	ncclResult_t (*all_gather)(const void *s, void *r, size_t n, ncclDataType_t t,
				   ncclComm_t comm, cudaStream_t st);
	ncclResult_t (*broadcast)(const void *s, void *r, size_t n, ncclDataType_t t, int root,
				  ncclComm_t comm, cudaStream_t st);
	ncclResult_t (*reduce)(const void *s, void *r, size_t n, ncclDataType_t t,
			       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t st);
	const char *(*error_string)(ncclResult_t r);
	const char *(*last_error)(ncclComm_t comm);
} nccl;
static char load_error[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load_nccl(void)
{
	static const char *const names[] = {
		"ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommGetAsyncError",
		"ncclCommAbort", "ncclCommFinalize", "ncclCommDestroy", "ncclAllReduce",
		"ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclReduce",
		"ncclGetErrorString",
		"ncclGetLastError",
	};
	void **slots = (void **)&nccl;
	void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);

	_Static_assert(sizeof(nccl) == sizeof(names) / sizeof(names[0]) * sizeof(void *),
		       "one name per entry point");
	if (!h)
		h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(load_error, sizeof(load_error), "libnccl.so.2: %s", dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		slots[i] = dlsym(h, names[i]);
		if (!slots[i]) {
			snprintf(load_error, sizeof(load_error), "libnccl: no %s", names[i]);
			memset(&nccl, 0, sizeof(nccl));
			return;
		}
	}
}

static int need_nccl(struct eng_error *err)
{
	(void)pthread_once(&load_once, load_nccl);
	if (!nccl.get_unique_id)
		return eng_fail(err, -ELIBACC, "dist (nccl): %s", load_error);
	return 0;
}

struct nccl_dist {
	struct dist base;       /* first: the struct dist * callers hold */
	ncclComm_t comm;
	cudaStream_t stream;
	/* reduce's own stream (created at open), so that the gradient buckets
	 * of a backward pass reduce while the engine's stream computes the
	 * next layers; each reduce waits for the engine's mark first. */
	cudaStream_t comm_stream;
	int device;             /* CUDA ordinal: reduce runs on another thread */
	float *one;             /* device: the barrier's all-reduce */
};

static void pause_poll(void)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = 50000 };

	(void)nanosleep(&ts, NULL);
}

/* The code of a failed NCCL call in `op`, with its text; aborts the
 * communicator and breaks the group. */
static int fail_nccl(struct nccl_dist *n, const char *op, ncclResult_t res, struct eng_error *err)
{
	const char *last = nccl.last_error(n->comm);
	int code = res == ncclRemoteError || res == ncclSystemError ? -ECONNRESET : -EIO;

	/* The message first: NCCL's last-error text may not outlive the abort. */
	code = eng_fail(err, code, "dist %s (nccl, rank %d of %d): %s%s%s", op, n->base.rank,
			n->base.world_size, nccl.error_string(res), last && last[0] ? ": " : "",
			last ? last : "");
	if (n->comm)
		(void)nccl.abort(n->comm);
	n->comm = NULL;
	n->base.broken = true;
	return code;
}

static int fail_timeout(struct nccl_dist *n, const char *op, struct eng_error *err)
{
	if (n->comm)
		(void)nccl.abort(n->comm);
	n->comm = NULL;
	n->base.broken = true;
	return eng_fail(err, -ETIMEDOUT, "dist %s (nccl, rank %d of %d): did not complete "
			"within %g s (a rank did not arrive; NCCL does not say which); the "
			"communicator was aborted", op, n->base.rank, n->base.world_size,
			n->base.timeout_s);
}

/* A CUDA call of `op` failed: abort the communicator, break the group. */
static int fail_cuda(struct nccl_dist *n, const char *op, cudaError_t ce, struct eng_error *err)
{
	if (n->comm)
		(void)nccl.abort(n->comm);
	n->comm = NULL;
	n->base.broken = true;
	return eng_fail(err, -EIO, "dist %s (nccl): CUDA: %s", op, cudaGetErrorString(ce));
}

/* Wait until the communicator has no pending work (open) and, on_stream,
 * the stream `st` is done (a collective), or the timeout. */
static int wait_done_on(struct nccl_dist *n, const char *op, bool on_stream, cudaStream_t st,
			struct eng_error *err)
{
	const double deadline = eng_now_s() + n->base.timeout_s;

	for (;;) {
		ncclResult_t res = ncclSuccess;

		if (nccl.async_error(n->comm, &res) != ncclSuccess)
			res = ncclInternalError;
		if (res != ncclSuccess && res != ncclInProgress)
			return fail_nccl(n, op, res, err);
		if (!on_stream && res == ncclSuccess)
			return 0;
		if (on_stream && res == ncclSuccess) {
			cudaError_t ce = cudaStreamQuery(st);

			if (ce == cudaSuccess)
				return 0;
			if (ce != cudaErrorNotReady)
				return fail_cuda(n, op, ce, err);
		}
		if (eng_now_s() > deadline)
			return fail_timeout(n, op, err);
		pause_poll();
	}
}

static int wait_done(struct nccl_dist *n, const char *op, bool on_stream, struct eng_error *err)
{
	return wait_done_on(n, op, on_stream, n->stream, err);
}

/* The checks every collective makes first (dist_call_check): the byte
 * count of world_size slices must fit. */
static int enter(struct dist *d, const char *op, int64_t count, enum dist_dtype t,
		 struct eng_error *err)
{
	return dist_call_check(d, op, count, (int)t, d ? (size_t)d->world_size : 1, NULL, err);
}

/* An enqueued collective's result, then the wait on the stream. */
static int finish(struct nccl_dist *n, const char *op, ncclResult_t res, struct eng_error *err)
{
	if (res != ncclSuccess && res != ncclInProgress)
		return fail_nccl(n, op, res, err);
	return wait_done(n, op, true, err);
}

static ncclDataType_t nccl_type(enum dist_dtype t)
{
	return t == DIST_F64 ? ncclFloat64 : ncclFloat32;
}

static int nccl_create_id(const struct dist_config *cfg, struct dist_group_id *ret,
			  struct eng_error *err)
{
	ncclUniqueId id;
	ncclResult_t res;
	int r = need_nccl(err);

	(void)cfg;
	if (r < 0)
		return r;
	res = nccl.get_unique_id(&id);
	if (res != ncclSuccess)
		return eng_fail(err, -EIO, "dist group id (nccl): ncclGetUniqueId: %s",
				nccl.error_string(res));
	_Static_assert(sizeof(id) <= DIST_GROUP_ID_MAX, "an NCCL id fits a group id");
	memcpy(ret->bytes, &id, sizeof(id));
	ret->len = sizeof(id);
	return 0;
}

static void nccl_close(struct dist *d)
{
	struct nccl_dist *n = (struct nccl_dist *)d;

	if (!n)
		return;
	if (n->comm) {
		/* A healthy group: finish its work, bounded like the rest. */
		const double deadline = eng_now_s() + n->base.timeout_s;
		ncclResult_t res = nccl.finalize(n->comm);

		while (res == ncclInProgress && eng_now_s() < deadline) {
			pause_poll();
			if (nccl.async_error(n->comm, &res) != ncclSuccess)
				res = ncclInternalError;
		}
		if (res == ncclSuccess)
			(void)nccl.destroy(n->comm);
		else
			(void)nccl.abort(n->comm);
	}
	if (n->one)
		(void)cudaFree(n->one);
	if (n->comm_stream)
		(void)cudaStreamDestroy(n->comm_stream);
	free(n);
}

static int nccl_open(const struct dist_config *cfg, struct dist **ret, struct eng_error *err)
{
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	ncclUniqueId id;
	struct nccl_dist *n;
	ncclResult_t res;
	cudaError_t ce;
	int r;

	r = dist_config_check_min(cfg, 1, err);
	if (r < 0)
		return r;
	if (cfg->id.len != sizeof(id))
		return eng_fail(err, -EINVAL, "dist.group_id: %zu bytes, not an NCCL id (%zu "
				"bytes; CreateGroup on a cuda daemon makes one)", cfg->id.len,
				sizeof(id));
	r = need_nccl(err);
	if (r < 0)
		return r;
	ce = cudaSetDevice(cfg->cuda_device);
	if (ce != cudaSuccess)
		return eng_fail(err, ce == cudaErrorNoDevice || ce == cudaErrorInsufficientDriver ?
				-ENODEV : -EIO, "dist open (nccl): CUDA device %d: %s",
				cfg->cuda_device, cudaGetErrorString(ce));
	n = calloc(1, sizeof(*n));
	if (!n)
		return eng_fail(err, -ENOMEM, "dist open: out of memory");
	n->base.ops = &nccl_dist_ops;
	n->base.rank = cfg->rank;
	n->base.world_size = cfg->world_size;
	n->base.timeout_s = cfg->timeout_s;
	n->stream = (cudaStream_t)cfg->stream;
	n->device = cfg->cuda_device;
	ce = cudaMalloc((void **)&n->one, sizeof(float));
	if (ce == cudaSuccess)
		ce = cudaMemset(n->one, 0, sizeof(float));
	if (ce == cudaSuccess)
		ce = cudaStreamCreateWithFlags(&n->comm_stream, cudaStreamNonBlocking);
	if (ce != cudaSuccess) {
		nccl_close(&n->base);
		return eng_fail(err, -ENOMEM, "dist open (nccl): device memory or stream: %s",
				cudaGetErrorString(ce));
	}

	memcpy(&id, cfg->id.bytes, sizeof(id));
	config.blocking = 0;
	res = nccl.init_rank_config(&n->comm, cfg->world_size, id, cfg->rank, &config);
	if (res != ncclSuccess && res != ncclInProgress) {
		r = fail_nccl(n, "open", res, err);
	} else if (!n->comm) {
		r = eng_fail(err, -EIO, "dist open (nccl): no communicator");
	} else {
		r = wait_done(n, "open", false, err);
		if (r == -ETIMEDOUT) {
			eng_error_clear(err);
			r = eng_fail(err, -ETIMEDOUT, "dist open (nccl, rank %d of %d): the group "
				     "did not form within %g s (a rank did not join; NCCL does not "
				     "say which)", cfg->rank, cfg->world_size, cfg->timeout_s);
		}
	}
	if (r < 0) {
		nccl_close(&n->base);
		return r;
	}
	*ret = &n->base;
	return 0;
}

static int nccl_all_reduce(struct dist *d, void *buf, int64_t count, enum dist_dtype t,
			   struct eng_error *err)
{
	struct nccl_dist *n = (struct nccl_dist *)d;
	int r = enter(d, "all_reduce", count, t, err);

	if (r < 0 || count == 0)
		return r;
	if (!buf)
		return eng_fail(err, -EINVAL, "dist all_reduce: buf is NULL");
	return finish(n, "all_reduce", nccl.all_reduce(buf, buf, (size_t)count, nccl_type(t),
						       ncclSum, n->comm, n->stream), err);
}

static int nccl_reduce_scatter(struct dist *d, void *out, const void *in, int64_t count,
			       enum dist_dtype t, struct eng_error *err)
{
	struct nccl_dist *n = (struct nccl_dist *)d;
	int r = enter(d, "reduce_scatter", count, t, err);

	if (r < 0 || count == 0)
		return r;
	if (!out || !in)
		return eng_fail(err, -EINVAL, "dist reduce_scatter: %s is NULL",
				out ? "in" : "out");
	/* out == in + rank * count is NCCL's in-place form. */
	return finish(n, "reduce_scatter", nccl.reduce_scatter(in, out, (size_t)count,
							       nccl_type(t), ncclSum, n->comm,
							       n->stream), err);
}

static int nccl_all_gather(struct dist *d, void *out, const void *in, int64_t count,
			   enum dist_dtype t, struct eng_error *err)
{
	struct nccl_dist *n = (struct nccl_dist *)d;
	int r = enter(d, "all_gather", count, t, err);

	if (r < 0 || count == 0)
		return r;
	if (!out || !in)
		return eng_fail(err, -EINVAL, "dist all_gather: %s is NULL", out ? "in" : "out");
	/* in == out + rank * count is NCCL's in-place form. */
	return finish(n, "all_gather", nccl.all_gather(in, out, (size_t)count, nccl_type(t),
						       n->comm, n->stream), err);
}

/* On the group's comm stream, complete when it returns: buf must be ready
 * (the caller synchronized its writes). May run on a thread of its own
 * (native_shard_comm.c, a ZeRO-3 layer's gather beside the engine's
 * compute), which must first select the group's device. */
static int nccl_broadcast(struct dist *d, void *buf, int64_t count, enum dist_dtype t, int root,
			  struct eng_error *err)
{
	struct nccl_dist *n = (struct nccl_dist *)d;
	int r = dist_rooted_check(d, "broadcast", buf, count, (int)t, root, NULL, err);
	ncclResult_t res;
	cudaError_t ce;

	if (r)
		return r < 0 ? r : 0;
	ce = cudaSetDevice(n->device);
	if (ce != cudaSuccess)
		return fail_cuda(n, "broadcast", ce, err);
	res = nccl.broadcast(buf, buf, (size_t)count, nccl_type(t), root, n->comm, n->comm_stream);
	if (res != ncclSuccess && res != ncclInProgress)
		return fail_nccl(n, "broadcast", res, err);
	return wait_done_on(n, "broadcast", true, n->comm_stream, err);
}

/* On the group's comm stream, after the engine's mark: the sum to the
 * root, then zero on the other ranks (dist.h). May run on a thread of its
 * own (native_grad_sync.c), which must first select the group's device. */
static int nccl_reduce(struct dist *d, void *buf, int64_t count, enum dist_dtype t, int root,
		       const void *after, struct eng_error *err)
{
	struct nccl_dist *n = (struct nccl_dist *)d;
	size_t bytes = 0;
	ncclResult_t res;
	cudaError_t ce;
	int r = dist_rooted_check(d, "reduce", buf, count, (int)t, root, &bytes, err);

	if (r)
		return r < 0 ? r : 0;
	ce = cudaSetDevice(n->device);
	if (ce == cudaSuccess && after)
		ce = cudaStreamWaitEvent(n->comm_stream, (cudaEvent_t)after, 0);
	if (ce != cudaSuccess)
		return fail_cuda(n, "reduce", ce, err);
	res = nccl.reduce(buf, buf, (size_t)count, nccl_type(t), ncclSum, root, n->comm,
			  n->comm_stream);
	if (res != ncclSuccess && res != ncclInProgress)
		return fail_nccl(n, "reduce", res, err);
	if (d->rank != root && (ce = cudaMemsetAsync(buf, 0, bytes, n->comm_stream)) !=
	    cudaSuccess)
		return fail_cuda(n, "reduce", ce, err);
	return wait_done_on(n, "reduce", true, n->comm_stream, err);
}

static int nccl_barrier(struct dist *d, struct eng_error *err)
{
	struct nccl_dist *n = (struct nccl_dist *)d;
	int r = enter(d, "barrier", 0, DIST_F32, err);

	if (r < 0)
		return r;
	return finish(n, "barrier", nccl.all_reduce(n->one, n->one, 1, ncclFloat32, ncclSum,
						    n->comm, n->stream), err);
}

const struct dist_ops nccl_dist_ops = {
	.name = "nccl",
	.device = "cuda",
	.create_id = nccl_create_id,
	.open = nccl_open,
	.close = nccl_close,
	.all_reduce = nccl_all_reduce,
	.reduce_scatter = nccl_reduce_scatter,
	.all_gather = nccl_all_gather,
	.broadcast = nccl_broadcast,
	.reduce = nccl_reduce,
	.barrier = nccl_barrier,
};
