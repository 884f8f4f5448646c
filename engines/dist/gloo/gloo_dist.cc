/* gloo_dist.cc — the Gloo backend of dist.h: collectives over host memory
 * (the CPU device) between the ranks of a data-parallel group.
 *
 * Everything that talks to a peer is Gloo's own (Debian's libgloo-dev,
 * 2022): the rendezvous is gloo::rendezvous::FileStore under
 * store_root/<32 hex digits of the id> (a PrefixStore per world size, so a
 * rank told another world size times out instead of misreading addresses),
 * the transport is gloo::transport::tcp, the group is a
 * gloo::rendezvous::Context joined with connectFullMesh, and the
 * collectives are gloo::allreduce, gloo::allgather, gloo::broadcast,
 * gloo::alltoall, gloo::reduce and gloo::barrier (reduce-scatter is an
 * all-to-all and a local sum: see reduce_scatter_chunks). This file only
 * checks arguments, enforces the deadline and turns exceptions into codes.
 *
 * No C++ exception leaves this file: each entry point catches them all.
 * gloo::IoException is an I/O failure of a pair: "timeout" in its text ->
 * -ETIMEDOUT, any other (a peer closed its socket: "Connection closed by
 * peer", "Connection reset by peer") -> -ECONNRESET; any other exception ->
 * -EIO with its text. After any failure but -EINVAL the group is broken and
 * every later call returns -ENOTCONN at once (dist.h).
 *
 * A group is used by one thread at a time (reduce may be called from
 * another thread than the rest, never at the same time: dist.h). The sums
 * run on the calling thread; Gloo's TCP device has an I/O thread of its
 * own. Writes to a dead peer raise
 * SIGPIPE: the process must ignore it (engined does, daemon/main.c).
 */
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

extern "C" {
#include "dist/dist.h"
}

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/* A Gloo id: this tag, then the 16 random bytes that name the group's
 * directory. */
const uint8_t ID_TAG[4] = { 'g', 'l', 'o', '1' };
constexpr size_t ID_RANDOM = 16;
constexpr size_t ID_LEN = sizeof(ID_TAG) + ID_RANDOM;

/* Reduce-scatter works through a scratch copy of at most this many bytes at
 * a time. */
constexpr size_t RS_CHUNK_BYTES = 64u << 20;

struct gloo_dist {
	struct dist base;       /* first: the struct dist * callers hold */
	std::shared_ptr<gloo::rendezvous::Context> ctx;
	milliseconds timeout;
	uint32_t tag;           /* one per collective, the same on every rank */
	/* reduce_scatter_chunks' buffers, kept for the group's life: fresh
	 * pages cost the kernel a zeroing on every call (more than the
	 * transfer itself on a VM). */
	std::vector<uint8_t> rs_scratch;
};
static_assert(std::is_standard_layout<gloo_dist>::value, "struct dist must lead gloo_dist");

/* The dtype as an int, read without loading it as the enum: C callers may
 * pass any int (enter() refuses the unknown ones), and in C++ a value
 * outside an unfixed enum's range is undefined. */
int dtype_value(const enum dist_dtype *t)
{
	int v;

	static_assert(sizeof(v) == sizeof(*t), "enum dist_dtype is an int");
	memcpy(&v, t, sizeof(v));
	return v;
}

size_t dtype_size(int t)
{
	return t == DIST_F64 ? 8 : 4;
}

milliseconds timeout_ms(double s)
{
	return milliseconds(std::max<int64_t>(1, (int64_t)(s * 1000.0)));
}

/* store_root/<hex of the id's random bytes>. */
std::string group_dir(const char *root, const uint8_t *random)
{
	static const char hex[] = "0123456789abcdef";
	std::string s(root);

	s += '/';
	for (size_t i = 0; i < ID_RANDOM; i++) {
		s += hex[random[i] >> 4];
		s += hex[random[i] & 15];
	}
	return s;
}

/* The deadline of open over connectFullMesh's store accesses, which would
 * otherwise wait gloo's default 30 s for each key: every wait ends at the
 * deadline, and the key it waited for names the rank that did not come. */
class DeadlineStore : public gloo::rendezvous::Store {
public:
	DeadlineStore(gloo::rendezvous::Store &inner, clock_type::time_point deadline)
		: inner_(inner), deadline_(deadline)
	{
	}

	void set(const std::string &key, const std::vector<char> &data) override
	{
		inner_.set(key, data);
	}

	std::vector<char> get(const std::string &key) override
	{
		wait({ key });
		return inner_.get(key);
	}

	void wait(const std::vector<std::string> &keys) override
	{
		wait(keys, remaining());
	}

	void wait(const std::vector<std::string> &keys, const milliseconds &timeout) override
	{
		try {
			inner_.wait(keys, std::min(timeout, remaining()));
		} catch (const gloo::IoException &) {
			missing = keys.empty() ? "" : keys[0];
			throw;
		}
	}

	/* The key of the wait that timed out: "rank_<r>" or "<r>". */
	std::string missing;

private:
	/* At least 1 ms: a zero timeout is "wait forever" to FileStore. */
	milliseconds remaining() const
	{
		auto left = std::chrono::duration_cast<milliseconds>(deadline_ - clock_type::now());
		return std::max(left, milliseconds(1));
	}

	gloo::rendezvous::Store &inner_;
	clock_type::time_point deadline_;
};

bool is_timeout(const char *what)
{
	return strstr(what, "imeout") || strstr(what, "Timed out");
}

/* The code and message of an exception caught in `op`; breaks the group. */
int fail_io(struct gloo_dist *g, const char *op, const char *what, struct eng_error *err)
{
	g->base.broken = true;
	if (is_timeout(what))
		return eng_fail(err, -ETIMEDOUT, "dist %s (gloo, rank %d of %d): a peer did not "
				"answer within %g s: %s", op, g->base.rank, g->base.world_size,
				g->base.timeout_s, what);
	return eng_fail(err, -ECONNRESET, "dist %s (gloo, rank %d of %d): a peer closed its "
			"connection (a rank died?): %s", op, g->base.rank, g->base.world_size,
			what);
}

int fail_other(struct gloo_dist *g, const char *op, int code, const char *what,
	       struct eng_error *err)
{
	g->base.broken = true;
	return eng_fail(err, code, "dist %s (gloo, rank %d of %d): %s", op, g->base.rank,
			g->base.world_size, what);
}

/* Run one collective, with every exception turned into a code. */
template <typename F>
int guarded(struct gloo_dist *g, const char *op, struct eng_error *err, F &&fn)
{
	try {
		fn();
		return 0;
	} catch (const gloo::IoException &e) {
		return fail_io(g, op, e.what(), err);
	} catch (const std::bad_alloc &) {
		return fail_other(g, op, -ENOMEM, "out of memory", err);
	} catch (const std::exception &e) {
		return fail_other(g, op, -EIO, e.what(), err);
	} catch (...) {
		return fail_other(g, op, -EIO, "unknown exception", err);
	}
}

/* The checks every collective makes first (dist_call_check);
 * *ret_bytes = count elements of t times `slices`. */
int enter(struct dist *d, const char *op, int64_t count, int t, size_t slices,
	  size_t *ret_bytes, struct eng_error *err)
{
	return dist_call_check(d, op, count, t, slices, ret_bytes, err);
}

/* Remove the group's directory and the FileStore's files in it (rank 0,
 * once every rank has joined): an id forms one group. Best effort. */
void remove_group_dir(const std::string &dir)
{
	DIR *dp = opendir(dir.c_str());
	struct dirent *e;

	if (!dp)
		return;
	while ((e = readdir(dp)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			(void)unlinkat(dirfd(dp), e->d_name, 0);
	(void)closedir(dp);
	(void)rmdir(dir.c_str());
}

gloo::AllreduceOptions::Func sum_fn(int t)
{
	using fn = void (*)(void *, const void *, const void *, size_t);

	if (t == DIST_F64)
		return static_cast<fn>(&gloo::sum<double>);
	return static_cast<fn>(&gloo::sum<float>);
}

void all_reduce_sum(struct gloo_dist *g, void *buf, size_t count, int t)
{
	gloo::AllreduceOptions opts(g->ctx);

	if (t == DIST_F64)
		opts.setOutput(static_cast<double *>(buf), count);
	else
		opts.setOutput(static_cast<float *>(buf), count);
	opts.setReduceFunction(sum_fn(t));
	opts.setTag(g->tag++);
	opts.setTimeout(g->timeout);
	gloo::allreduce(opts);
}

/* Reduce-scatter as gloo::alltoall plus a local sum, chunk by chunk: each
 * rank sends every other rank that rank's part of its buffer and sums the
 * W parts it receives of its own slice, in rank order (so the sum's order
 * is fixed). Each rank moves (W-1)/W of the buffer each way, the traffic
 * of a true reduce-scatter (an all-reduce moves twice that). The 2022
 * Gloo has no reduce-scatter on its UnboundBuffer API, and its
 * ReduceScatterHalvingDoubling (the older pair buffers) leaves a pair
 * stalled after it at world size 3 (the next all-reduce took 16 s here). */
void reduce_scatter_chunks(struct gloo_dist *g, uint8_t *out, const uint8_t *in, size_t count,
			   int t)
{
	const size_t es = dtype_size(t), world = (size_t)g->base.world_size;
	const size_t chunk = std::min(count, std::max<size_t>(1, RS_CHUNK_BYTES / (world * es)));
	/* One chunk: `in` itself is the all-to-all's input, [world, count]. */
	const bool whole = chunk == count;
	const size_t part = world * chunk * es;
	const auto sum = sum_fn(t);

	if (g->rs_scratch.size() < (whole ? 1 : 2) * part)
		g->rs_scratch.resize((whole ? 1 : 2) * part);
	uint8_t *recv = g->rs_scratch.data(), *send = whole ? const_cast<uint8_t *>(in)
							     : recv + part;
	for (size_t c0 = 0; c0 < count; c0 += chunk) {
		const size_t len = std::min(chunk, count - c0);
		gloo::AlltoallOptions opts(g->ctx);

		/* Rank r's part of this chunk: in[r * count + c0, + len). Read
		 * before out[c0, + len) is written, so out may alias in's slice. */
		for (size_t r = 0; r < world && !whole; r++)
			memcpy(&send[r * len * es], &in[(r * count + c0) * es], len * es);
		if (t == DIST_F64) {
			opts.setInput(reinterpret_cast<double *>(send), world * len);
			opts.setOutput(reinterpret_cast<double *>(recv), world * len);
		} else {
			opts.setInput(reinterpret_cast<float *>(send), world * len);
			opts.setOutput(reinterpret_cast<float *>(recv), world * len);
		}
		opts.setTag(g->tag++);
		opts.setTimeout(g->timeout);
		gloo::alltoall(opts);
		/* recv[q] is rank q's part of this rank's slice: summed in rank
		 * order straight into out. */
		uint8_t *dst = &out[c0 * es];
		if (world == 1)
			memmove(dst, recv, len * es);
		else
			sum(dst, recv, recv + len * es, len);
		for (size_t q = 2; q < world; q++)
			sum(dst, dst, recv + q * len * es, len);
	}
}

} // namespace

static int gloo_create_id(const struct dist_config *cfg, struct dist_group_id *ret,
			  struct eng_error *err)
{
	uint8_t random[ID_RANDOM];
	struct stat st;
	size_t got = 0;

	if (!cfg->store_root || !cfg->store_root[0])
		return eng_fail(err, -EINVAL, "dist.store_root: unset (the Gloo FileStore root "
				"every rank reaches)");
	if (stat(cfg->store_root, &st) < 0)
		return eng_fail(err, eng_errno_code(errno), "dist.store_root %s: %s (create it: "
				"a directory every rank reaches)", cfg->store_root,
				eng_errno_text(errno));
	if (!S_ISDIR(st.st_mode))
		return eng_fail(err, -EINVAL, "dist.store_root %s: not a directory",
				cfg->store_root);
	while (got < ID_RANDOM) {
		ssize_t n = getrandom(random + got, ID_RANDOM - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return eng_fail(err, -EIO, "dist group id: getrandom: %s", strerror(errno));
		got += (size_t)n;
	}

	std::string dir;
	try {
		dir = group_dir(cfg->store_root, random);
	} catch (...) {
		return eng_fail(err, -ENOMEM, "dist group id: out of memory");
	}
	/* 0700: the directory's name is the secret, its files the pairs'
	 * addresses; chmod as well, in case the umask took more. */
	if (mkdir(dir.c_str(), 0700) < 0 || chmod(dir.c_str(), 0700) < 0)
		return eng_fail(err, eng_errno_code(errno), "dist.store_root %s: cannot create "
				"the group's directory: %s", cfg->store_root,
				eng_errno_text(errno));
	memcpy(ret->bytes, ID_TAG, sizeof(ID_TAG));
	memcpy(ret->bytes + sizeof(ID_TAG), random, ID_RANDOM);
	ret->len = ID_LEN;
	return 0;
}

static int gloo_open(const struct dist_config *cfg, struct dist **ret, struct eng_error *err)
{
	struct gloo_dist *g;
	struct stat st;
	int r;

	r = dist_config_check_min(cfg, 1, err);
	if (r < 0)
		return r;
	if (cfg->id.len != ID_LEN || memcmp(cfg->id.bytes, ID_TAG, sizeof(ID_TAG)) != 0)
		return eng_fail(err, -EINVAL, "dist.group_id: not a Gloo group id (%zu bytes; "
				"CreateGroup on a cpu daemon makes one)", cfg->id.len);
	if (!cfg->store_root || !cfg->store_root[0])
		return eng_fail(err, -EINVAL, "dist.store_root: unset (the Gloo FileStore root "
				"every rank reaches)");

	g = new (std::nothrow) gloo_dist();
	if (!g)
		return eng_fail(err, -ENOMEM, "dist open: out of memory");
	g->base.ops = &gloo_dist_ops;
	g->base.rank = cfg->rank;
	g->base.world_size = cfg->world_size;
	g->base.timeout_s = cfg->timeout_s;
	g->timeout = timeout_ms(cfg->timeout_s);

	std::string dir;
	try {
		dir = group_dir(cfg->store_root, cfg->id.bytes + sizeof(ID_TAG));
	} catch (...) {
		delete g;
		return eng_fail(err, -ENOMEM, "dist open: out of memory");
	}
	const int e = stat(dir.c_str(), &st) < 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
	if (e) {
		r = e == ENOENT || e == ENOTDIR ? -ENOENT : eng_errno_code(e);
		delete g;
		return eng_fail(err, r, "dist.group_id: no such group under dist.store_root %s "
				"(an id from CreateGroup with this store_root forms one group, "
				"once)", cfg->store_root);
	}

	const auto deadline = clock_type::now() + g->timeout;
	std::shared_ptr<gloo::transport::Device> dev;
	try {
		gloo::transport::tcp::attr attr;

		if (cfg->host && cfg->host[0])
			attr.hostname = cfg->host;
		dev = gloo::transport::tcp::CreateDevice(attr);
	} catch (const std::exception &e) {
		delete g;
		return eng_fail(err, -EIO, "dist.host %s: Gloo cannot listen there: %s",
				cfg->host && cfg->host[0] ? cfg->host : "(unset: the host name)",
				e.what());
	} catch (...) {
		delete g;
		return eng_fail(err, -EIO, "dist.host: Gloo cannot create its TCP device");
	}

	std::string missing;
	r = guarded(g, "open", err, [&] {
		gloo::rendezvous::FileStore file_store(dir);
		gloo::rendezvous::PrefixStore prefix("world" + std::to_string(cfg->world_size),
						     file_store);
		DeadlineStore store(prefix, deadline);

		g->ctx = std::make_shared<gloo::rendezvous::Context>(cfg->rank, cfg->world_size);
		g->ctx->setTimeout(g->timeout);
		try {
			g->ctx->connectFullMesh(store, dev);
		} catch (...) {
			missing = store.missing;
			throw;
		}
		/* Every rank is past connectFullMesh (no more store reads):
		 * rank 0 removes the group's files. */
		gloo::BarrierOptions opts(g->ctx);
		opts.setTag(g->tag++);
		opts.setTimeout(std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(
						 deadline - clock_type::now())));
		gloo::barrier(opts);
	});
	if (r == -ETIMEDOUT && !missing.empty()) {
		int who = atoi(missing.c_str() + (missing.rfind("rank_", 0) == 0 ? 5 : 0));

		eng_error_clear(err);
		r = eng_fail(err, -ETIMEDOUT, "dist open (gloo, rank %d of %d): rank %d did not "
			     "join the group within %g s", cfg->rank, cfg->world_size, who,
			     cfg->timeout_s);
	}
	if (r < 0) {
		delete g;
		return r;
	}
	if (cfg->rank == 0)
		remove_group_dir(dir);
	*ret = &g->base;
	return 0;
}

static void gloo_close(struct dist *d)
{
	try {
		delete reinterpret_cast<struct gloo_dist *>(d);
	} catch (...) {
		/* A destructor that throws: nothing left to do. */
	}
}

static int gloo_all_reduce(struct dist *d, void *buf, int64_t count, enum dist_dtype t,
			   struct eng_error *err)
{
	struct gloo_dist *g = reinterpret_cast<struct gloo_dist *>(d);
	size_t bytes = 0;
	const int tv = dtype_value(&t);
	int r = enter(d, "all_reduce", count, tv, 1, &bytes, err);

	if (r < 0 || count == 0)
		return r;
	if (!buf)
		return eng_fail(err, -EINVAL, "dist all_reduce: buf is NULL");
	return guarded(g, "all_reduce", err, [&] { all_reduce_sum(g, buf, (size_t)count, tv); });
}

static int gloo_reduce_scatter(struct dist *d, void *out, const void *in, int64_t count,
			       enum dist_dtype t, struct eng_error *err)
{
	struct gloo_dist *g = reinterpret_cast<struct gloo_dist *>(d);
	size_t bytes = 0;
	const int tv = dtype_value(&t);
	int r = enter(d, "reduce_scatter", count, tv, d ? (size_t)d->world_size : 1, &bytes, err);

	if (r < 0 || count == 0)
		return r;
	if (!out || !in)
		return eng_fail(err, -EINVAL, "dist reduce_scatter: %s is NULL",
				out ? "in" : "out");
	return guarded(g, "reduce_scatter", err, [&] {
		reduce_scatter_chunks(g, static_cast<uint8_t *>(out),
				      static_cast<const uint8_t *>(in), (size_t)count, tv);
	});
}

static int gloo_all_gather(struct dist *d, void *out, const void *in, int64_t count,
			   enum dist_dtype t, struct eng_error *err)
{
	struct gloo_dist *g = reinterpret_cast<struct gloo_dist *>(d);
	size_t bytes = 0;
	const int tv = dtype_value(&t);
	int r = enter(d, "all_gather", count, tv, d ? (size_t)d->world_size : 1, &bytes, err);

	if (r < 0 || count == 0)
		return r;
	if (!out || !in)
		return eng_fail(err, -EINVAL, "dist all_gather: %s is NULL", out ? "in" : "out");

	const size_t slice = bytes / (size_t)d->world_size;
	uint8_t *o = static_cast<uint8_t *>(out);
	const uint8_t *own = o + (size_t)d->rank * slice;
	const uint8_t *i = static_cast<const uint8_t *>(in);
	const bool in_place = i == own;

	if (!in_place && i < o + bytes && o < i + slice)
		return eng_fail(err, -EINVAL, "dist all_gather: in overlaps out other than as "
				"this rank's slice");
	return guarded(g, "all_gather", err, [&] {
		gloo::AllgatherOptions opts(g->ctx);

		/* In place: the own slice is already there (gloo copies `in`
		 * into it otherwise). */
		if (!in_place)
			opts.setInput(const_cast<uint8_t *>(i), slice);
		opts.setOutput(o, bytes);
		opts.setTag(g->tag++);
		opts.setTimeout(g->timeout);
		gloo::allgather(opts);
	});
}

static int gloo_broadcast(struct dist *d, void *buf, int64_t count, enum dist_dtype t, int root,
			  struct eng_error *err)
{
	struct gloo_dist *g = reinterpret_cast<struct gloo_dist *>(d);
	size_t bytes = 0;
	const int tv = dtype_value(&t);
	int r = dist_rooted_check(d, "broadcast", buf, count, tv, root, &bytes, err);

	if (r)
		return r < 0 ? r : 0;
	return guarded(g, "broadcast", err, [&] {
		gloo::BroadcastOptions opts(g->ctx);

		opts.setOutput(static_cast<uint8_t *>(buf), bytes);
		opts.setRoot(root);
		opts.setTag(g->tag++);
		opts.setTimeout(g->timeout);
		gloo::broadcast(opts);
	});
}

/* gloo::reduce: a ring reduce-scatter of buf, then each rank's reduced
 * chunk to the root (so every rank's link carries about 2x its share of
 * buf, not the root's alone). It leaves partial sums in the other ranks'
 * buf, which dist.h says is zero afterwards: cleared here. Host memory
 * only: `after` is always NULL for the CPU device. */
static int gloo_reduce(struct dist *d, void *buf, int64_t count, enum dist_dtype t, int root,
		       const void *after, struct eng_error *err)
{
	struct gloo_dist *g = reinterpret_cast<struct gloo_dist *>(d);
	size_t bytes = 0;
	const int tv = dtype_value(&t);
	int r = dist_rooted_check(d, "reduce", buf, count, tv, root, &bytes, err);

	(void)after;
	if (r)
		return r < 0 ? r : 0;
	r = guarded(g, "reduce", err, [&] {
		gloo::ReduceOptions opts(g->ctx);

		if (tv == DIST_F64)
			opts.setOutput(static_cast<double *>(buf), (size_t)count);
		else
			opts.setOutput(static_cast<float *>(buf), (size_t)count);
		opts.setRoot(root);
		opts.setReduceFunction(sum_fn(tv));
		opts.setTag(g->tag++);
		opts.setTimeout(g->timeout);
		gloo::reduce(opts);
	});
	if (r == 0 && d->rank != root)
		memset(buf, 0, bytes);
	return r;
}

static int gloo_barrier(struct dist *d, struct eng_error *err)
{
	struct gloo_dist *g = reinterpret_cast<struct gloo_dist *>(d);
	size_t bytes = 0;
	int r = enter(d, "barrier", 0, DIST_F32, 1, &bytes, err);

	if (r < 0)
		return r;
	return guarded(g, "barrier", err, [&] {
		gloo::BarrierOptions opts(g->ctx);

		opts.setTag(g->tag++);
		opts.setTimeout(g->timeout);
		gloo::barrier(opts);
	});
}

extern "C" const struct dist_ops gloo_dist_ops = {
	.name = "gloo",
	.device = "cpu",
	.create_id = gloo_create_id,
	.open = gloo_open,
	.close = gloo_close,
	.all_reduce = gloo_all_reduce,
	.reduce_scatter = gloo_reduce_scatter,
	.all_gather = gloo_all_gather,
	.broadcast = gloo_broadcast,
	.reduce = gloo_reduce,
	.barrier = gloo_barrier,
};
