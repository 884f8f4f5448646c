/* bench_dist.c — all-reduce bandwidth of the Gloo backend (engines/dist/,
 * through gloo_dist_ops) against Gloo's own allreduce called directly on a
 * context of the same kind (bench_dist_gloo.cc), in the same run: 2 forked
 * ranks on loopback, f32 sums of 1, 16 and 64 MiB. docs/PERF.md's goal:
 * the backend >= 90% of the library's own bandwidth.
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

#define WORLD 2
#define ROUNDS 15

static const struct {
	size_t mib;
	int iters;
} sizes[] = { { 1, 40 }, { 16, 6 }, { 64, 2 } };

#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, const struct eng_error *err)
{
	fprintf(stderr, "bench_dist: %s: %s\n", what, err->msg);
	exit(1);
}

/* One rank: both paths, every size; rank 0 prints. */
static void run_rank(int rank, const char *root, const struct dist_group_id *id,
		     const char *direct_dir)
{
	const struct dist_ops *ops = &gloo_dist_ops;
	struct dist_config cfg = { .rank = rank, .world_size = WORLD, .id = *id, .timeout_s = 120,
				   .store_root = root, .host = "127.0.0.1" };
	struct eng_error err = { 0 };
	struct bench_gloo *direct;
	struct dist *d = NULL;
	float *buf;

	if (ops->open(&cfg, &d, &err))
		die("open", &err);
	direct = bench_gloo_open(direct_dir, rank, WORLD, "127.0.0.1", 120);
	buf = calloc(sizes[N_SIZES - 1].mib << 18, sizeof(float));
	if (!buf) {
		fprintf(stderr, "bench_dist: out of memory\n");
		exit(1);
	}
	if (rank == 0) {
		printf("bench_dist: all-reduce (sum, f32), %d ranks on loopback, median of %d "
		       "rounds\n", WORLD, ROUNDS);
		printf("  %8s  %14s  %14s  %6s\n", "size", "dist.h (gloo)", "gloo direct", "ratio");
	}
	for (size_t s = 0; s < N_SIZES; s++) {
		const size_t count = sizes[s].mib << 18, bytes = count * sizeof(float);
		double gb_dist[ROUNDS], gb_direct[ROUNDS];

		/* Warm up both paths (pages touched, pairs' buffers grown). */
		if (ops->all_reduce(d, buf, (int64_t)count, DIST_F32, &err))
			die("all_reduce", &err);
		bench_gloo_all_reduce(direct, buf, count);
		for (int r = 0; r < ROUNDS; r++) {
			for (int k = 0; k < 2; k++) {
				const int path = (k + r) % 2;       /* 0: dist.h, 1: direct */
				double t0;

				if (ops->barrier(d, &err))
					die("barrier", &err);
				t0 = now_s();
				for (int i = 0; i < sizes[s].iters; i++) {
					if (path == 1)
						bench_gloo_all_reduce(direct, buf, count);
					else if (ops->all_reduce(d, buf, (int64_t)count, DIST_F32,
								 &err))
						die("all_reduce", &err);
				}
				(path ? gb_direct : gb_dist)[r] = (double)bytes * sizes[s].iters /
								 (now_s() - t0) / 1e9;
			}
		}
		if (rank == 0) {
			double a = median(gb_dist, ROUNDS), b = median(gb_direct, ROUNDS);

			printf("  %5zu MiB  %9.2f GB/s  %9.2f GB/s  %6.3f\n", sizes[s].mib, a, b,
			       a / b);
			fflush(stdout);
		}
	}
	free(buf);
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
