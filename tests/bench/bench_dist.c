/* bench_dist.c — collective bandwidth of the Gloo backend (engines/dist/,
 * through gloo_dist_ops) against Gloo's own allreduce called directly on a
 * context of the same kind (bench_dist_gloo.cc), in the same run: 2 forked
 * ranks on loopback, f32 sums of buffers of 1, 16 and 64 MiB.
 *   all-reduce: the backend's against Gloo's on the same buffer; goal
 *     (docs/PERF.md) >= 90% of the library's own bandwidth;
 *   reduce-scatter (what OptimizerStep reduces the gradients with): the
 *     backend's of the buffer (an all-to-all and a local sum) against
 *     Gloo's all-reduce of the same buffer, which is what a reduce-scatter
 *     built on it costs: a true reduce-scatter moves half the bytes, so
 *     its ratio should approach 2;
 *   reduce to owners in buckets (what a ForwardBackward with
 *     reduce_gradients does while its backward runs): the buffer from the
 *     top in buckets of BUCKET_MIB, each reduced to the rank whose half it
 *     is in (split at the halves' boundary), against the same all-reduce.
 *     Gloo's reduce is a ring reduce-scatter then a gather to the root,
 *     and the buckets go one after another, so it moves more than the
 *     reduce-scatter: the price of overlapping it with the backward.
 *
 * Each size runs ROUNDS rounds; a round times `iters` back-to-back
 * all-reduces on each path, the two paths alternating which goes first.
 * Printed: the median over rounds of bytes / time per all-reduce (the
 * algorithm bandwidth; with 2 ranks the bus bandwidth is the same), and
 * the ratio of the medians. Usage: bench_dist (no arguments).
 */
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_dist_gloo.h"
#include "dist/dist.h"
#include "bench_util.h"

#define WORLD 2
#define ROUNDS 15
#define BUCKET_MIB 4

static const struct {
	size_t mib;
	int iters;
} sizes[] = { { 1, 40 }, { 16, 6 }, { 64, 2 } };

#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

static void die(const char *what, const struct eng_error *err)
{
	fprintf(stderr, "bench_dist: %s: %s\n", what, err->msg);
	exit(1);
}

/* kind 2: buf[count] to its owners (rank r owns the r-th of WORLD equal
 * slices) in buckets from the top, as native_grad_sync.c reduces. */
static int reduce_to_owners(struct dist *d, float *buf, size_t count, struct eng_error *err)
{
	const size_t S = count / WORLD, B = (size_t)BUCKET_MIB << 18;
	int rc = 0;

	for (size_t hi = count; hi > 0 && rc == 0;) {
		size_t lo = hi > B ? hi - B : 0;

		for (size_t a = lo; a < hi && rc == 0;) {
			size_t owner = a / S, b = (owner + 1) * S < hi ? (owner + 1) * S : hi;

			rc = gloo_dist_ops.reduce(d, buf + a, (int64_t)(b - a), DIST_F32, (int)owner,
						  NULL, err);
			a = b;
		}
		hi = lo;
	}
	return rc;
}

/* One path's collective on a buffer of `count` floats: kind 0 the
 * backend's all-reduce, 1 its reduce-scatter (count / WORLD to each rank),
 * 2 its reduce to owners in buckets; direct: Gloo's own all-reduce. */
static void one(struct dist *d, struct bench_gloo *direct, float *buf, float *out, size_t count,
		int kind, int path)
{
	struct eng_error err = { 0 };

	if (path == 1)
		bench_gloo_all_reduce(direct, buf, count);
	else if (kind == 0 && gloo_dist_ops.all_reduce(d, buf, (int64_t)count, DIST_F32, &err))
		die("all_reduce", &err);
	else if (kind == 1 && gloo_dist_ops.reduce_scatter(d, out, buf, (int64_t)(count / WORLD),
							   DIST_F32, &err))
		die("reduce_scatter", &err);
	else if (kind == 2 && reduce_to_owners(d, buf, count, &err))
		die("reduce", &err);
}

/* Size s of one kind, both paths interleaved; rank 0 prints. */
static void bench_size(struct dist *d, struct bench_gloo *direct, float *buf, float *out,
		       size_t s, int kind, int rank)
{
	const size_t count = sizes[s].mib << 18, bytes = count * sizeof(float);
	double gb_dist[ROUNDS], gb_direct[ROUNDS];
	struct eng_error err = { 0 };

	/* Warm up both paths (pages touched, pairs' buffers grown). */
	one(d, direct, buf, out, count, kind, 0);
	one(d, direct, buf, out, count, kind, 1);
	for (int r = 0; r < ROUNDS; r++) {
		for (int k = 0; k < 2; k++) {
			const int path = (k + r) % 2;       /* 0: dist.h, 1: direct */
			double t0;

			if (gloo_dist_ops.barrier(d, &err))
				die("barrier", &err);
			t0 = now_s();
			for (int i = 0; i < sizes[s].iters; i++)
				one(d, direct, buf, out, count, kind, path);
			(path ? gb_direct : gb_dist)[r] = (double)bytes * sizes[s].iters /
							 (now_s() - t0) / 1e9;
		}
	}
	if (rank == 0) {
		double a = median(gb_dist, ROUNDS), b = median(gb_direct, ROUNDS);

		printf("  %5zu MiB  %9.2f GB/s  %9.2f GB/s  %6.3f\n", sizes[s].mib, a, b, a / b);
		fflush(stdout);
	}
}

/* One rank: both kinds, both paths, every size; rank 0 prints. */
static void run_rank(int rank, const char *root, const struct dist_group_id *id,
		     const char *direct_dir)
{
	const struct dist_ops *ops = &gloo_dist_ops;
	struct dist_config cfg = { .rank = rank, .world_size = WORLD, .id = *id, .timeout_s = 120,
				   .store_root = root, .host = "127.0.0.1" };
	struct eng_error err = { 0 };
	struct bench_gloo *direct;
	struct dist *d = NULL;
	float *buf, *out;

	if (ops->open(&cfg, &d, &err))
		die("open", &err);
	direct = bench_gloo_open(direct_dir, rank, WORLD, "127.0.0.1", 120);
	buf = calloc(sizes[N_SIZES - 1].mib << 18, sizeof(float));
	out = calloc(sizes[N_SIZES - 1].mib << 18, sizeof(float));
	if (!buf || !out) {
		fprintf(stderr, "bench_dist: out of memory\n");
		exit(1);
	}
	static const char *const what[] = { "all-reduce", "reduce-scatter",
					     "reduce to owners in 4 MiB buckets" };
	static const char *const col[] = { "dist.h (gloo)", "dist.h r-scat", "dist.h reduce" };

	for (int kind = 0; kind < 3; kind++) {
		if (rank == 0) {
			printf("bench_dist: %s (sum, f32), %d ranks on loopback, median of %d "
			       "rounds\n", what[kind], WORLD, ROUNDS);
			printf("  %8s  %14s  %14s  %6s\n", "buffer", col[kind],
			       kind ? "gloo all-red." : "gloo direct", "ratio");
		}
		for (size_t s = 0; s < N_SIZES; s++)
			bench_size(d, direct, buf, out, s, kind, rank);
	}
	free(buf);
	free(out);
	bench_gloo_close(direct);
	ops->close(d);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	return remove(path);
}

int main(void)
{
	struct dist_config cfg = { .world_size = WORLD, .timeout_s = 120 };
	char root[] = "/tmp/bench_dist.XXXXXX", direct_dir[sizeof(root) + 8];
	struct eng_error err = { 0 };
	struct dist_group_id id;
	pid_t pids[WORLD];
	int failed = 0;

	if (!gloo_dist_ops.name) {
		fprintf(stderr, "bench_dist: no Gloo in this build\n");
		return 77;
	}
	if (!mkdtemp(root)) {
		perror("mkdtemp");
		return 1;
	}
	cfg.store_root = root;
	if (gloo_dist_ops.create_id(&cfg, &id, &err))
		die("create_id", &err);
	snprintf(direct_dir, sizeof(direct_dir), "%s/direct", root);
	if (mkdir(direct_dir, 0700)) {
		perror("mkdir");
		return 1;
	}
	for (int r = 0; r < WORLD; r++) {
		pids[r] = fork();
		if (pids[r] < 0) {
			perror("fork");
			return 1;
		}
		if (pids[r] == 0) {
			signal(SIGPIPE, SIG_IGN);
			run_rank(r, root, &id, direct_dir);
			_exit(0);
		}
	}
	for (int r = 0; r < WORLD; r++) {
		int st;

		if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st))
			failed = 1;
	}
	(void)nftw(root, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return failed;
}
