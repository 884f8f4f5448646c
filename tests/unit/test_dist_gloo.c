/* test_dist_gloo.c — the Gloo backend of engines/dist/ (dist.h) between
 * real processes on loopback: each test forks one process per rank (world
 * sizes 2 and 3); the parent, as rank 0's daemon would, makes the group id in
 * a temporary store root. Exits 77 (skipped) when this build has no Gloo.
 *
 * Values are small integers scaled by rank, so every sum is exact in F32
 * and F64 and compared with ==. Nothing depends on the machine's speed: the
 * timeouts of the failure tests only bound how long a call may take, and the
 * parent's hang guard (HANG_GUARD_S) is far above them.
 *
 * In a rank's process a failed check prints and exits 1 (want()); the
 * parent asserts each rank's exit status.
 */
#include "check_run.h"
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist.h"

#define HANG_GUARD_S 60
#define OK_TIMEOUT_S 30.0

static const struct dist_ops *ops;

struct group {
	char root[64];                  /* the store root, a temporary directory */
	struct dist_group_id id;
	int world;
};

/* In a rank's process: on failure print and exit 1. */
static void want(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void want(bool ok, const char *fmt, ...)
{
	va_list ap;

	if (ok)
		return;
	va_start(ap, fmt);
	fputs("FAIL: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	_exit(1);
}

static void make_group(struct group *g, int world)
{
	struct dist_config cfg = { .rank = 0, .world_size = world, .timeout_s = OK_TIMEOUT_S };
	struct eng_error err = { 0 };

	strcpy(g->root, "/tmp/test_dist_gloo.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(g->root));
	cfg.store_root = g->root;
	g->world = world;
	g->id.len = 0;
	ck_assert_int_eq(ops->create_id(&cfg, &g->id, &err), 0);
	ck_assert_int_gt((int)g->id.len, 0);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	return remove(path);
}

static void drop_group(struct group *g)
{
	(void)nftw(g->root, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static int open_rank(const struct group *g, int rank, double timeout_s, struct dist **ret,
		     struct eng_error *err)
{
	struct dist_config cfg = {
		.rank = rank, .world_size = g->world, .id = g->id, .timeout_s = timeout_s,
		.store_root = g->root, .host = "127.0.0.1",
	};

	return ops->open(&cfg, ret, err);
}

typedef void (*rank_fn)(const struct group *g, int rank);

/* Fork one process per rank in [0, n) running fn; returns their pids. */
static void spawn(const struct group *g, int n, rank_fn fn, pid_t *pids)
{
	for (int r = 0; r < n; r++) {
		pid_t pid = fork();

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			/* A write to a dead peer must fail, not kill (dist.h). */
			signal(SIGPIPE, SIG_IGN);
			fn(g, r);
			_exit(0);
		}
		pids[r] = pid;
	}
}

/* The wait status of each of n processes; any still running after the hang
 * guard is killed and fails the test. */
static void reap(const pid_t *pids, int n, int *status)
{
	time_t end = time(NULL) + HANG_GUARD_S;
	int left = n;

	for (int i = 0; i < n; i++)
		status[i] = -1;
	while (left > 0) {
		for (int i = 0; i < n; i++) {
			if (status[i] != -1)
				continue;
			if (waitpid(pids[i], &status[i], WNOHANG) == pids[i])
				left--;
			else
				status[i] = -1;
		}
		if (left > 0 && time(NULL) > end) {
			for (int i = 0; i < n; i++)
				if (status[i] == -1)
					kill(pids[i], SIGKILL);
			ck_abort_msg("a rank hung for %d s", HANG_GUARD_S);
		}
		if (left > 0)
			usleep(10000);
	}
}

static void run_group(int world, rank_fn fn)
{
	struct group g;
	pid_t pids[8];
	int status[8];

	make_group(&g, world);
	spawn(&g, world, fn, pids);
	reap(pids, world, status);
	drop_group(&g);
	for (int r = 0; r < world; r++)
		ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
			      "rank %d of %d failed (status 0x%x)", r, world, status[r]);
}

/* 1 + 2 + ... + world: the sum of (rank + 1) over the ranks. */
static int rank_sum(int world)
{
	return world * (world + 1) / 2;
}

static void check_all_reduce(struct dist *d, int rank, int world)
{
	struct eng_error err = { 0 };
	enum { N = 1000 };
	float f[N];
	double x[N];

	for (int i = 0; i < N; i++) {
		f[i] = (float)((rank + 1) * (i % 7 + 1));
		x[i] = (double)(rank + 1) * (double)i * 1e6;
	}
	want(ops->all_reduce(d, f, N, DIST_F32, &err) == 0, "all_reduce f32: %s", err.msg);
	want(ops->all_reduce(d, x, N, DIST_F64, &err) == 0, "all_reduce f64: %s", err.msg);
	for (int i = 0; i < N; i++) {
		want(f[i] == (float)(rank_sum(world) * (i % 7 + 1)), "all_reduce f32 [%d] = %g",
		     i, f[i]);
		want(x[i] == (double)rank_sum(world) * (double)i * 1e6, "all_reduce f64 [%d] = %g",
		     i, x[i]);
	}
}

static void check_reduce_scatter(struct dist *d, int rank, int world)
{
	struct eng_error err = { 0 };
	enum { N = 777 };       /* per rank; odd, so the algorithm's chunks are uneven */
	float *in = malloc(sizeof(float) * N * (size_t)world), out[N];
	double *xin = malloc(sizeof(double) * N * (size_t)world), xout[N];

	want(in && xin, "malloc");
	for (int i = 0; i < N * world; i++) {
		in[i] = (float)((rank + 1) * i);
		xin[i] = (double)(rank + 1) * (double)i;
	}
	want(ops->reduce_scatter(d, out, in, N, DIST_F32, &err) == 0, "reduce_scatter: %s",
	     err.msg);
	want(ops->reduce_scatter(d, xout, xin, N, DIST_F64, &err) == 0, "reduce_scatter f64: %s",
	     err.msg);
	for (int k = 0; k < N; k++) {
		want(out[k] == (float)(rank_sum(world) * (rank * N + k)),
		     "reduce_scatter [%d] = %g", k, out[k]);
		want(xout[k] == (double)rank_sum(world) * (double)(rank * N + k),
		     "reduce_scatter f64 [%d] = %g", k, xout[k]);
	}
	/* out is this rank's slice of in. */
	want(ops->reduce_scatter(d, in + rank * N, in, N, DIST_F32, &err) == 0,
	     "reduce_scatter in place: %s", err.msg);
	for (int k = 0; k < N; k++)
		want(in[rank * N + k] == (float)(rank_sum(world) * (rank * N + k)),
		     "reduce_scatter in place [%d] = %g", k, in[rank * N + k]);
	free(in);
	free(xin);
}

/* More than one scratch chunk of the backend (64 MiB), out aliasing in's
 * slice: each chunk of in is read before out overwrites it. */
static void check_reduce_scatter_chunks(struct dist *d, int rank, int world)
{
	struct eng_error err = { 0 };
	const int64_t n = 9 * 1000 * 1000;      /* per rank: 2 chunks at world 2 */
	float *in = malloc(sizeof(float) * (size_t)(n * world)), *out = in + rank * n;

	want(in != NULL, "malloc");
	for (int64_t j = 0; j < n * world; j++)
		in[j] = (float)((rank + 1) * (int)(j % 1001));
	want(ops->reduce_scatter(d, out, in, n, DIST_F32, &err) == 0, "reduce_scatter 9M: %s",
	     err.msg);
	for (int64_t k = 0; k < n; k++)
		if (out[k] != (float)(rank_sum(world) * (int)((rank * n + k) % 1001)))
			want(false, "reduce_scatter 9M [%lld] = %g", (long long)k, out[k]);
	free(in);
}

static void check_all_gather(struct dist *d, int rank, int world)
{
	struct eng_error err = { 0 };
	enum { N = 513 };
	float in[N], *out = malloc(sizeof(float) * N * (size_t)world);
	double xin[N], *xout = malloc(sizeof(double) * N * (size_t)world);

	want(out && xout, "malloc");
	for (int k = 0; k < N; k++) {
		in[k] = (float)(rank * 1000 + k);
		xin[k] = (double)(rank * 1000 + k) * 1e9;
	}
	want(ops->all_gather(d, out, in, N, DIST_F32, &err) == 0, "all_gather: %s", err.msg);
	want(ops->all_gather(d, xout, xin, N, DIST_F64, &err) == 0, "all_gather f64: %s", err.msg);
	for (int r = 0; r < world; r++)
		for (int k = 0; k < N; k++) {
			want(out[r * N + k] == (float)(r * 1000 + k), "all_gather [%d][%d] = %g", r,
			     k, out[r * N + k]);
			want(xout[r * N + k] == (double)(r * 1000 + k) * 1e9,
			     "all_gather f64 [%d][%d]", r, k);
		}
	/* in is this rank's slice of out. */
	for (int i = 0; i < N * world; i++)
		out[i] = -1.0f;
	memcpy(out + rank * N, in, sizeof(in));
	want(ops->all_gather(d, out, out + rank * N, N, DIST_F32, &err) == 0,
	     "all_gather in place: %s", err.msg);
	for (int r = 0; r < world; r++)
		for (int k = 0; k < N; k++)
			want(out[r * N + k] == (float)(r * 1000 + k),
			     "all_gather in place [%d][%d] = %g", r, k, out[r * N + k]);
	free(out);
	free(xout);
}

static void check_broadcast_barrier(struct dist *d, int rank, int world)
{
	struct eng_error err = { 0 };
	const int root = world - 1;     /* not rank 0 */
	enum { N = 300 };
	double x[N];

	for (int i = 0; i < N; i++)
		x[i] = rank == root ? (double)(i * 3 + 1) : -1.0;
	want(ops->broadcast(d, x, N, DIST_F64, root, &err) == 0, "broadcast: %s", err.msg);
	for (int i = 0; i < N; i++)
		want(x[i] == (double)(i * 3 + 1), "broadcast [%d] = %g", i, x[i]);
	want(ops->barrier(d, &err) == 0, "barrier: %s", err.msg);
}

/* Sum to each root in turn: the root holds the exact sum, every other rank
 * zeros (dist.h); sizes below, at and above the ring's segment (1 MiB) and
 * not divisible by the world size; f64 too. */
static void check_reduce(struct dist *d, int rank, int world)
{
	struct eng_error err = { 0 };
	static const int64_t sizes[] = { 1, 5, 1001, 262144 + 13, 3 * 262144 + 7 };
	double x[37];

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		const int64_t n = sizes[s];
		float *b = malloc(sizeof(float) * (size_t)n);

		want(b != NULL, "malloc");
		for (int root = 0; root < world; root++) {
			for (int64_t i = 0; i < n; i++)
				b[i] = (float)((rank + 1) * (int)(i % 501 + root));
			want(ops->reduce(d, b, n, DIST_F32, root, NULL, &err) == 0,
			     "reduce %lld to %d: %s", (long long)n, root, err.msg);
			for (int64_t i = 0; i < n; i++)
				if (b[i] != (rank == root ? (float)(rank_sum(world) *
							  (int)(i % 501 + root)) : 0.0f))
					want(false, "reduce %lld to %d: [%lld] = %g on rank %d",
					     (long long)n, root, (long long)i, b[i], rank);
		}
		free(b);
	}
	for (int i = 0; i < 37; i++)
		x[i] = (double)(rank + 1) * (double)i * 1e9;
	want(ops->reduce(d, x, 37, DIST_F64, 1, NULL, &err) == 0, "reduce f64: %s", err.msg);
	for (int i = 0; i < 37; i++)
		want(x[i] == (rank == 1 ? (double)rank_sum(world) * (double)i * 1e9 : 0.0),
		     "reduce f64 [%d] = %g on rank %d", i, x[i], rank);
	want(ops->reduce(d, NULL, 0, DIST_F32, 0, NULL, &err) == 0, "reduce 0: %s", err.msg);
	want(ops->reduce(d, x, 1, DIST_F64, world, NULL, &err) == -EINVAL, "reduce root = world");
	want(ops->reduce(d, NULL, 1, DIST_F32, 0, NULL, &err) == -EINVAL, "reduce NULL buf");
	want(!d->broken, "broken by -EINVAL");
}

static void check_counts(struct dist *d, int rank, int world)
{
	struct eng_error err = { 0 };
	const int64_t big = 5 * 1000 * 1000;
	float one = 1.0f, *b = malloc(sizeof(float) * (size_t)big);

	want(b != NULL, "malloc");
	/* count 0: nothing to do, no buffer needed. */
	want(ops->all_reduce(d, NULL, 0, DIST_F32, &err) == 0, "all_reduce 0: %s", err.msg);
	want(ops->reduce_scatter(d, NULL, NULL, 0, DIST_F32, &err) == 0, "rs 0: %s", err.msg);
	want(ops->all_gather(d, NULL, NULL, 0, DIST_F64, &err) == 0, "ag 0: %s", err.msg);
	want(ops->broadcast(d, NULL, 0, DIST_F32, 0, &err) == 0, "bc 0: %s", err.msg);
	/* 5M floats, exact: (rank + 1) * (i % 1000) summed. */
	for (int64_t i = 0; i < big; i++)
		b[i] = (float)((rank + 1) * (int)(i % 1000));
	want(ops->all_reduce(d, b, big, DIST_F32, &err) == 0, "all_reduce 5M: %s", err.msg);
	for (int64_t i = 0; i < big; i++)
		if (b[i] != (float)(rank_sum(world) * (int)(i % 1000)))
			want(false, "all_reduce 5M [%lld] = %g", (long long)i, b[i]);
	free(b);

	/* Bad arguments: -EINVAL, and the group stays usable. */
	want(ops->all_reduce(d, &one, -1, DIST_F32, &err) == -EINVAL, "count -1");
	want(ops->all_reduce(d, NULL, 1, DIST_F32, &err) == -EINVAL, "NULL buf");
	want(ops->all_reduce(d, &one, 1, (enum dist_dtype)7, &err) == -EINVAL, "dtype 7");
	want(ops->broadcast(d, &one, 1, DIST_F32, world, &err) == -EINVAL, "root = world");
	want(ops->broadcast(d, &one, 1, DIST_F32, -1, &err) == -EINVAL, "root -1");
	want(ops->reduce_scatter(d, NULL, &one, 1, DIST_F32, &err) == -EINVAL, "rs NULL out");
	want(ops->all_gather(d, &one, NULL, 1, DIST_F32, &err) == -EINVAL, "ag NULL in");
	want(ops->all_reduce(NULL, &one, 1, DIST_F32, &err) == -EINVAL, "no group");
	{
		float out[8];   /* in overlaps out, not as this rank's slice */

		want(ops->all_gather(d, out, out + (rank == 0 ? 1 : 0), 2, DIST_F32, &err) ==
		     -EINVAL, "ag overlap");
	}
	want(!d->broken, "broken by -EINVAL");
	want(ops->barrier(d, &err) == 0, "barrier after EINVAL: %s", err.msg);
}

static void rank_collectives(const struct group *g, int rank)
{
	struct eng_error err = { 0 };
	struct dist *d = NULL;

	want(open_rank(g, rank, OK_TIMEOUT_S, &d, &err) == 0, "open rank %d: %s", rank, err.msg);
	want(d->rank == rank && d->world_size == g->world && d->ops == ops, "group head");
	check_all_reduce(d, rank, g->world);
	check_reduce_scatter(d, rank, g->world);
	check_all_gather(d, rank, g->world);
	check_broadcast_barrier(d, rank, g->world);
	check_reduce(d, rank, g->world);
	check_counts(d, rank, g->world);
	if (g->world == 2)
		check_reduce_scatter_chunks(d, rank, g->world);
	ops->close(d);
}

START_TEST(collectives_world_2)
{
	run_group(2, rank_collectives);
}
END_TEST

START_TEST(collectives_world_3)
{
	run_group(3, rank_collectives);
}
END_TEST

/* Rank 2 of 3 never comes: the others' open returns -ETIMEDOUT naming it. */
static void rank_left_waiting(const struct group *g, int rank)
{
	struct eng_error err = { 0 };
	struct dist *d = NULL;
	int r = open_rank(g, rank, 2.0, &d, &err);

	want(r == -ETIMEDOUT, "open rank %d: %s (%s)", rank, eng_strerror(r), err.msg);
	want(d == NULL, "ret set on failure");
	/* It names rank 2 (or the other live rank, had that one been more
	 * than the timeout late: nothing here depends on speed). */
	const char *m = strstr(err.msg, "): rank ");
	int who = m ? atoi(m + 8) : -1;

	want(m && strstr(m, "did not join the group"), "the message names a rank: %s", err.msg);
	want(who == 2 || who == 1 - rank, "the message names rank 2: %s", err.msg);
	fprintf(stderr, "rank %d: %s: %s\n", rank, eng_strerror(r), err.msg);
}

START_TEST(rank_never_arrives)
{
	struct group g;
	pid_t pids[2];
	int status[2];

	make_group(&g, 3);
	spawn(&g, 2, rank_left_waiting, pids);
	reap(pids, 2, status);
	drop_group(&g);
	for (int r = 0; r < 2; r++)
		ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
			      "rank %d failed (status 0x%x)", r, status[r]);
}
END_TEST

/* Rank 2 of 3 is killed after the group formed: the others' next collective
 * fails (-ECONNRESET, or -ETIMEDOUT when the peer they waited on was a
 * survivor that gave up), the one after returns -ENOTCONN at once. */
static void rank_survives_a_death(const struct group *g, int rank)
{
	struct eng_error err = { 0 };
	struct dist *d = NULL;
	float buf[1024] = { 0 };
	int r;

	want(open_rank(g, rank, 5.0, &d, &err) == 0, "open rank %d: %s", rank, err.msg);
	want(ops->barrier(d, &err) == 0, "barrier: %s", err.msg);
	if (rank == 2)
		raise(SIGKILL);
	r = ops->all_reduce(d, buf, 1024, DIST_F32, &err);
	want(r == -ECONNRESET || r == -ETIMEDOUT, "rank %d all_reduce after a death: %s (%s)",
	     rank, eng_strerror(r), err.msg);
	want(d->broken, "broken after %s", eng_strerror(r));
	fprintf(stderr, "rank %d: %s: %s\n", rank, eng_strerror(r), err.msg);
	eng_error_clear(&err);
	want(ops->barrier(d, &err) == -ENOTCONN, "then -ENOTCONN: %s", err.msg);
	want(ops->all_reduce(d, buf, 1, DIST_F32, &err) == -ENOTCONN, "again -ENOTCONN");
	ops->close(d);
}

START_TEST(rank_killed)
{
	struct group g;
	pid_t pids[3];
	int status[3];

	make_group(&g, 3);
	spawn(&g, 3, rank_survives_a_death, pids);
	reap(pids, 3, status);
	drop_group(&g);
	ck_assert_msg(WIFSIGNALED(status[2]) && WTERMSIG(status[2]) == SIGKILL,
		      "rank 2 status 0x%x", status[2]);
	for (int r = 0; r < 2; r++)
		ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
			      "rank %d failed (status 0x%x)", r, status[r]);
}
END_TEST

/* Rank 1 of 2 is alive but never calls the collective: rank 0's returns
 * -ETIMEDOUT after the group's timeout, then -ENOTCONN. Rank 1 waits on a
 * pipe until rank 0 is done, so no step depends on timing. */
static int done_pipe[2];

static void rank_stalled_peer(const struct group *g, int rank)
{
	struct eng_error err = { 0 };
	struct dist *d = NULL;
	float buf[256] = { 0 };
	char c = 0;
	int r;

	want(open_rank(g, rank, 2.0, &d, &err) == 0, "open rank %d: %s", rank, err.msg);
	if (rank == 1) {
		want(read(done_pipe[0], &c, 1) == 1, "read the pipe");
		ops->close(d);
		return;
	}
	r = ops->all_reduce(d, buf, 256, DIST_F32, &err);
	want(r == -ETIMEDOUT, "all_reduce with a stalled peer: %s (%s)", eng_strerror(r),
	     err.msg);
	fprintf(stderr, "rank %d: %s: %s\n", rank, eng_strerror(r), err.msg);
	want(ops->barrier(d, &err) == -ENOTCONN, "then -ENOTCONN");
	want(write(done_pipe[1], "x", 1) == 1, "write the pipe");
	ops->close(d);
}

START_TEST(collective_times_out)
{
	struct group g;
	pid_t pids[2];
	int status[2];

	ck_assert_int_eq(pipe(done_pipe), 0);
	make_group(&g, 2);
	spawn(&g, 2, rank_stalled_peer, pids);
	reap(pids, 2, status);
	drop_group(&g);
	for (int r = 0; r < 2; r++)
		ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
			      "rank %d failed (status 0x%x)", r, status[r]);
}
END_TEST

/* create_id and open refuse bad configurations before anything connects. */
START_TEST(bad_configs)
{
	struct eng_error err = { 0 };
	struct dist_config cfg = { .rank = 0, .world_size = 2, .timeout_s = 1 };
	struct dist_group_id id = { .len = 0 };
	struct dist *d = NULL;
	struct group g;
	struct stat st;
	char dir[128];

	cfg.store_root = "/nonexistent/test_dist_gloo";
	ck_assert_int_eq(ops->create_id(&cfg, &id, &err), -ENOENT);
	ck_assert_int_eq((int)id.len, 0);
	cfg.store_root = NULL;
	ck_assert_int_eq(ops->create_id(&cfg, &id, &err), -EINVAL);

	make_group(&g, 2);
	/* The group's directory: store_root/<32 hex digits>, mode 0700. */
	ck_assert_int_eq((int)g.id.len, 20);
	snprintf(dir, sizeof(dir), "%s/", g.root);
	for (int i = 4; i < 20; i++)
		snprintf(dir + strlen(dir), 3, "%02x", g.id.bytes[i]);
	ck_assert_int_eq(stat(dir, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	ck_assert_int_eq((int)(st.st_mode & 0777), 0700);

	cfg = (struct dist_config){ .rank = 0, .world_size = 2, .id = g.id, .timeout_s = 1,
				    .store_root = g.root, .host = "127.0.0.1" };
	cfg.rank = 2;
	ck_assert_int_eq(ops->open(&cfg, &d, &err), -EINVAL);
	cfg.rank = 0;
	cfg.world_size = 0;
	ck_assert_int_eq(ops->open(&cfg, &d, &err), -EINVAL);
	cfg.world_size = 2;
	cfg.timeout_s = 0;
	ck_assert_int_eq(ops->open(&cfg, &d, &err), -EINVAL);
	cfg.timeout_s = 1;
	cfg.id.len = 19;
	ck_assert_int_eq(ops->open(&cfg, &d, &err), -EINVAL);
	cfg.id = g.id;
	cfg.id.bytes[10] ^= 1;          /* no such group */
	ck_assert_int_eq(ops->open(&cfg, &d, &err), -ENOENT);
	cfg.id = g.id;
	cfg.store_root = NULL;
	ck_assert_int_eq(ops->open(&cfg, &d, &err), -EINVAL);
	ck_assert_ptr_null(d);
	ck_assert_ptr_nonnull(strstr(dist_names(), "gloo"));
	/* The daemon's groups have two ranks or more. */
	cfg.store_root = g.root;
	cfg.world_size = 1;
	ck_assert_int_eq(dist_config_check(&cfg, &err), -EINVAL);
	/* The gradient bucket: 0 (the default) or within its bounds. */
	cfg.world_size = 2;
	ck_assert_int_eq(dist_config_check(&cfg, &err), 0);
	cfg.bucket_bytes = DIST_BUCKET_MIN;
	ck_assert_int_eq(dist_config_check(&cfg, &err), 0);
	cfg.bucket_bytes = DIST_BUCKET_MAX;
	ck_assert_int_eq(dist_config_check(&cfg, &err), 0);
	cfg.bucket_bytes = DIST_BUCKET_MIN - 1;
	eng_error_clear(&err);
	ck_assert_int_eq(dist_config_check(&cfg, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "dist.bucket_bytes: 1023, must be 0 (default 26214400) or in "
			 "[1024, 4294967296]");
	cfg.bucket_bytes = DIST_BUCKET_MAX + 1;
	ck_assert_int_eq(dist_config_check(&cfg, &err), -EINVAL);
	cfg.bucket_bytes = -1;
	ck_assert_int_eq(dist_config_check(&cfg, &err), -EINVAL);
	ops->close(NULL);
	drop_group(&g);
}
END_TEST

/* A group of one needs no peer; rank 0 removes the group's directory once
 * every rank joined, so an id forms one group. */
START_TEST(world_1_and_store_cleanup)
{
	struct eng_error err = { 0 };
	struct dist *d = NULL;
	struct group g;
	double x[4] = { 1, 2, 3, 4 }, y[4];

	make_group(&g, 1);
	ck_assert_int_eq(open_rank(&g, 0, OK_TIMEOUT_S, &d, &err), 0);
	ck_assert_int_eq(ops->all_reduce(d, x, 4, DIST_F64, &err), 0);
	ck_assert(x[0] == 1 && x[3] == 4);
	ck_assert_int_eq(ops->all_gather(d, y, x, 4, DIST_F64, &err), 0);
	ck_assert(y[0] == 1 && y[3] == 4);
	ops->close(d);
	ck_assert_int_eq(rmdir(g.root), 0);     /* empty: the group's directory is gone */
	d = NULL;
	mkdir(g.root, 0700);
	ck_assert_int_eq(open_rank(&g, 0, 1.0, &d, &err), -ENOENT);
	drop_group(&g);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("dist_gloo");
	TCase *tc = tcase_create("core");

	ops = dist_for_device("cpu");
	if (!ops || strcmp(ops->name, "gloo") != 0) {
		printf("no Gloo in this build: skipped\n");
		return 77;
	}
	tcase_set_timeout(tc, 2 * HANG_GUARD_S);
	tcase_add_test(tc, bad_configs);
	tcase_add_test(tc, world_1_and_store_cleanup);
	tcase_add_test(tc, collectives_world_2);
	tcase_add_test(tc, collectives_world_3);
	tcase_add_test(tc, rank_never_arrives);
	tcase_add_test(tc, rank_killed);
	tcase_add_test(tc, collective_times_out);
	suite_add_tcase(s, tc);
	return check_run(s);
}
