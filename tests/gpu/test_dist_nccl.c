/* test_dist_nccl.c — a smoke test of the NCCL backend of engines/dist/
 * (dist.h) on one GPU: a group of one rank (all-reduce, reduce-scatter,
 * all-gather, broadcast, barrier on device buffers, in place and not), and
 * a group of two whose second rank never comes (open returns -ETIMEDOUT
 * after the timeout, the communicator aborted). Exits 77 without a GPU,
 * without the NCCL backend in this build, or without libnccl.
 */
#include <cuda_runtime_api.h>

#include "dist/dist.h"
#include "gpu_test.h"

enum { N = 4096 };

static const struct dist_ops *ops;

static float *dev_copy(const float *h, size_t n)
{
	float *p = NULL;

	if (cudaMalloc((void **)&p, n * sizeof(float)) != cudaSuccess ||
	    (h && cudaMemcpy(p, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)) {
		printf("FAIL: cudaMalloc/cudaMemcpy of %zu floats\n", n);
		exit(1);
	}
	return p;
}

static void host_copy(float *h, const float *d, size_t n)
{
	if (cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
		printf("FAIL: cudaMemcpy to the host\n");
		exit(1);
	}
}

static bool same(const float *a, const float *b, size_t n)
{
	return memcmp(a, b, n * sizeof(float)) == 0;
}

static void group_of_one(cudaStream_t stream)
{
	struct eng_error err = { 0 };
	struct dist_config cfg = { .rank = 0, .world_size = 1, .timeout_s = 60,
				   .stream = stream, .cuda_device = 0 };
	struct dist *d = NULL;
	float h[N], got[N];
	float *a, *b;
	int r;

	r = ops->create_id(&cfg, &cfg.id, &err);
	gt_check(r == 0 && cfg.id.len == 128, "create_id: %s (%zu bytes)", err.msg, cfg.id.len);
	r = ops->open(&cfg, &d, &err);
	gt_check(r == 0, "open (world 1): %s", err.msg);
	if (r)
		return;
	for (int i = 0; i < N; i++)
		h[i] = (float)(i % 97) - 40.0f;
	a = dev_copy(h, N);
	b = dev_copy(NULL, N);

	gt_check(ops->all_reduce(d, a, N, DIST_F32, &err) == 0, "all_reduce: %s", err.msg);
	host_copy(got, a, N);
	gt_check(same(got, h, N), "all_reduce of one rank is the identity");

	gt_check(ops->all_gather(d, b, a, N, DIST_F32, &err) == 0, "all_gather: %s", err.msg);
	host_copy(got, b, N);
	gt_check(same(got, h, N), "all_gather");
	gt_check(ops->all_gather(d, b, b, N, DIST_F32, &err) == 0, "all_gather in place: %s",
		 err.msg);

	gt_check(ops->reduce_scatter(d, b, a, N, DIST_F32, &err) == 0, "reduce_scatter: %s",
		 err.msg);
	host_copy(got, b, N);
	gt_check(same(got, h, N), "reduce_scatter");
	gt_check(ops->reduce_scatter(d, a, a, N, DIST_F32, &err) == 0,
		 "reduce_scatter in place: %s", err.msg);

	gt_check(ops->broadcast(d, a, N, DIST_F32, 0, &err) == 0, "broadcast: %s", err.msg);
	host_copy(got, a, N);
	gt_check(same(got, h, N), "broadcast");
	gt_check(ops->barrier(d, &err) == 0, "barrier: %s", err.msg);

	/* reduce runs on the group's own stream after a mark of the engine's:
	 * it must see the copy queued on the engine's stream just before. */
	{
		float h2[N];
		cudaEvent_t ev;

		for (int i = 0; i < N; i++)
			h2[i] = 2.0f * h[i] + 1.0f;
		gt_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess,
			 "event");
		gt_check(cudaMemcpyAsync(b, h2, sizeof(h2), cudaMemcpyHostToDevice, stream) ==
			 cudaSuccess && cudaEventRecord(ev, stream) == cudaSuccess, "copy, mark");
		gt_check(ops->reduce(d, b, N, DIST_F32, 0, ev, &err) == 0, "reduce: %s", err.msg);
		host_copy(got, b, N);
		gt_check(same(got, h2, N), "reduce of one rank after a mark");
		gt_check(ops->reduce(d, b, N, DIST_F32, 1, NULL, &err) == -EINVAL,
			 "reduce to root 1 of 1");
		(void)cudaEventDestroy(ev);
	}

	gt_check(ops->all_reduce(d, NULL, 0, DIST_F32, &err) == 0, "count 0");
	gt_check(ops->all_reduce(d, a, -1, DIST_F32, &err) == -EINVAL, "count -1");
	gt_check(ops->broadcast(d, a, N, DIST_F32, 1, &err) == -EINVAL, "root 1 of 1");
	gt_check(!d->broken, "-EINVAL leaves the group usable");
	gt_check(ops->all_reduce(d, a, N / 2, DIST_F64, &err) == 0, "all_reduce f64: %s",
		 err.msg);
	ops->close(d);
	cudaFree(a);
	cudaFree(b);
}

/* Rank 1 of 2 never comes: open gives up at the timeout. */
static void missing_rank(cudaStream_t stream)
{
	struct eng_error err = { 0 };
	struct dist_config cfg = { .rank = 0, .world_size = 2, .timeout_s = 3,
				   .stream = stream, .cuda_device = 0 };
	struct dist *d = NULL;
	double t0;
	int r;

	gt_check(ops->create_id(&cfg, &cfg.id, &err) == 0, "create_id: %s", err.msg);
	t0 = gt_now();
	r = ops->open(&cfg, &d, &err);
	gt_check(r == -ETIMEDOUT, "open without rank 1: %s (%s)", eng_strerror(r), err.msg);
	gt_check(d == NULL, "no group on failure");
	gt_note("open without rank 1 returned %s after %.1f s: %s", eng_strerror(r),
		gt_now() - t0, err.msg);
}

int main(void)
{
	struct eng_error err = { 0 };
	struct dist_config probe = { .timeout_s = 1 };
	struct dist_group_id id;
	cudaStream_t stream;
	int r;

	if (gt_dry_run()) {
		printf("test_dist_nccl: SKIP (NCCL needs the CUDA device, not a dry run)\n");
		return 77;
	}
	gt_require_gpu("test_dist_nccl");
	ops = dist_for_device("cuda");
	if (!ops) {
		printf("test_dist_nccl: SKIP (no NCCL backend in this build)\n");
		return 77;
	}
	r = ops->create_id(&probe, &id, &err);
	if (r == -ELIBACC) {
		printf("test_dist_nccl: SKIP (%s)\n", err.msg);
		return 77;
	}
	if (cudaSetDevice(0) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
		printf("FAIL: cudaStreamCreate\n");
		return 1;
	}
	group_of_one(stream);
	missing_rank(stream);
	cudaStreamDestroy(stream);
	return gt_finish("test_dist_nccl");
}
