/* test_gpu_offload.c — real offload on the GPU: after to(host) the engine's
 * device memory (its own count and cudaMemGetInfo) drops to near zero, the
 * state sits in pinned host memory, and after to(device) the model trains
 * on, bit-identically to an engine that never moved. Exits 77 without a
 * GPU.
 *
 * Model: a ~150M-parameter llama (hidden 1024, 6 layers, vocab 32000), so
 * that its four state families (~2.4 GB) dwarf what the CUDA context and
 * the device's fixed buffers hold (cuBLASLt workspace, ~32 MiB).
 * "Near zero": the engine's mem_in_use below 1 MiB (the RoPE table stays),
 * and the process's device memory (cudaMemGetInfo) back within 128 MiB of
 * what it was before the engine existed.
 */
#include "gpu_test.h"

#include "device/cuda/cuda_device.h"

static const char *const MID_LLAMA =
	"{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 1024,"
	" \"intermediate_size\": 2816, \"num_hidden_layers\": 6,"
	" \"num_attention_heads\": 16, \"num_key_value_heads\": 4,"
	" \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0,"
	" \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096}";

static const int32_t LENS[] = { 500, 300, 200, 24 };

/* Device memory used by the whole process (MiB), or 0 in dry runs. */
static size_t used_mib(void)
{
	size_t fr, tot;

	if (gt_dry_run() || cuda_mem_info(&fr, &tot))
		return 0;
	return (tot - fr) >> 20;
}

static void set_mode(struct engine *e, enum engine_mode m)
{
	struct eng_error err = {0};

	if (engine_set_mode(e, m, false, &err)) {
		printf("FAIL: set_mode: %s\n", err.msg);
		exit(1);
	}
}

static void to(struct engine *e, bool dev)
{
	struct eng_error err = {0};

	if (engine_to(e, dev, true, true, true, &err)) {
		printf("FAIL: engine_to(%s): %s\n", dev ? "device" : "host", err.msg);
		exit(1);
	}
}

int main(void)
{
	struct engine *a, *b;
	struct engine_status st;
	struct gt_batch batch;
	size_t base, fam, on_dev, off_dev;
	double t0 = gt_now(), la = 0, lb = 0;

	gt_require_gpu("test_gpu_offload");
	if (!gt_dry_run()) {
		/* the CUDA context exists before the baseline is read */
		struct device *d = gt_open("cuda", MATMUL_FP32);

		d->ops->close(d);
	}
	base = used_mib();
	gt_make_batch(&batch, LENS, 4, 32000, 9);

	/* a: offload policy on (initialize leaves everything on the host) */
	a = gt_engine(MID_LLAMA, gt_dev_name(), true, 1, 1e-4, true);
	/* b: never moves */
	b = gt_engine(MID_LLAMA, gt_dev_name(), true, 1, 1e-4, false);
	engine_status(a, &st);
	fam = (size_t)st.num_parameters * sizeof(float);
	gt_note("families: 4 x %zu MiB; baseline %zu MiB in use", fam >> 20, base);
	gt_check(!st.placement.model && !st.placement.optimizer && !st.placement.grad,
		 "offload policy: state not on the host after initialize");
	gt_check(st.device_memory < (1u << 20), "after initialize: %zu bytes on the device",
		 st.device_memory);
	gt_check(st.host_memory == 4 * fam, "host memory %zu != 4 x %zu", st.host_memory, fam);

	for (int k = 0; k < 3; k++) {
		double t_in, t_out;

		t_in = gt_now();
		set_mode(a, ENGINE_MODE_TRAIN);
		t_in = gt_now() - t_in;
		engine_status(a, &st);
		on_dev = used_mib();
		gt_check(st.device_memory >= 4 * fam, "TRAIN: only %zu bytes on the device",
			 st.device_memory);
		la = gt_fb(a, &batch, false, NULL);
		lb = gt_fb(b, &batch, false, NULL);
		gt_step(a);
		gt_step(b);
		gt_check(la == lb, "step %d: loss %.9g (moved) != %.9g (resident)", k, la, lb);
		t_out = gt_now();
		set_mode(a, ENGINE_MODE_IDLE);
		t_out = gt_now() - t_out;
		engine_status(a, &st);
		off_dev = used_mib();
		gt_note("step %d: loss %.5f; device memory in TRAIN %zu MiB, IDLE %zu MiB "
			"(engine count %zu bytes); load %.2f s (%.1f GB/s), offload %.2f s "
			"(%.1f GB/s)", k, la, on_dev, off_dev, st.device_memory, t_in,
			4e-9 * fam / t_in, t_out, 4e-9 * fam / t_out);
		gt_check(st.device_memory < (1u << 20), "IDLE: engine still holds %zu bytes",
			 st.device_memory);
		/* b holds its own 4 families + activations: compare a's share */
		gt_check(gt_dry_run() || off_dev + (4 * fam >> 20) <= on_dev + 128,
			 "IDLE: cudaMemGetInfo shows %zu MiB, TRAIN showed %zu MiB (families %zu MiB)",
			 off_dev, on_dev, 4 * fam >> 20);
	}
	/* explicit to(host) / to(device), then a forward-only pass and a step */
	to(a, false);
	to(a, true);
	la = gt_fb(a, &batch, false, NULL);
	lb = gt_fb(b, &batch, false, NULL);
	gt_step(a);
	gt_step(b);
	gt_check(la == lb, "after to(host)/to(device): loss %.9g != %.9g", la, lb);
	gt_check(gt_param_digest(a) == gt_param_digest(b),
		 "parameters differ from the engine that never moved");
	engine_destroy(a);
	engine_destroy(b);
	gt_note("after destroying both engines: %zu MiB in use (baseline %zu)", used_mib(), base);
	gt_check(gt_dry_run() || used_mib() <= base + 64, "device memory not given back on destroy");
	free(batch.ids);
	gt_note("%.1f s", gt_now() - t0);
	return gt_finish("test_gpu_offload");
}
