/* bench_dist_gloo.h — Gloo's allreduce called directly (bench_dist_gloo.cc),
 * the peer bench_dist.c measures the dist.h backend against. */
#ifndef ENGINED_BENCH_DIST_GLOO_H
#define ENGINED_BENCH_DIST_GLOO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct bench_gloo;

/* Join the group whose FileStore is `dir` (exits on failure). */
struct bench_gloo *bench_gloo_open(const char *dir, int rank, int world, const char *host,
				   double timeout_s);
/* gloo::allreduce (sum) of buf[count] in place. */
void bench_gloo_all_reduce(struct bench_gloo *b, float *buf, size_t count);
void bench_gloo_close(struct bench_gloo *b);

#ifdef __cplusplus
}
#endif

#endif
