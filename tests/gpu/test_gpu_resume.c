/* test_gpu_resume.c — determinism and checkpoint resume on the GPU: the
 * same steps give the same bits twice, and a run resumed from a checkpoint
 * continues bit-identically to the uninterrupted one (docs/DESIGN.md §6), in
 * bf16 and fp32 matmul precision. Exits 77 without a GPU.
 *
 * Run A: 3 steps, save, 3 more steps (losses L4..L6, final digest).
 * Run B: a fresh engine from another seed loads A's checkpoint, 3 steps:
 * its losses and final parameters must equal A's bit for bit. Run C: a
 * fresh engine with A's seed repeats A's 6 steps: same bits (no atomics,
 * no order-dependent reductions anywhere in a step).
 */
#include <unistd.h>

#include "gpu_test.h"

static const int32_t LENS[] = { 200, 77, 129, 3, 300 };

static double train(struct engine *e, int from, int to_, double *losses)
{
	double l = 0;

	for (int s = from; s < to_; s++) {
		struct gt_batch b;

		gt_make_batch(&b, LENS, 5, 2048, 1000 + s);
		l = gt_fb(e, &b, false, NULL);
		gt_step(e);
		if (losses)
			losses[s] = l;
		free(b.ids);
	}
	return l;
}

static void run(bool bf16, const char *dir)
{
	struct eng_error err = {0};
	struct engine *a, *b, *c;
	double la[6], lb[6], lc[6];
	uint64_t da, db, dc;
	size_t bytes;
	int64_t step;
	const char *p = bf16 ? "bf16" : "fp32";

	a = gt_engine(GT_QWEN2_SMALL, gt_dev_name(), bf16, 21, 1e-3, false);
	train(a, 0, 3, la);
	gt_check(engine_save_checkpoint(a, dir, 3, 0, CKPT_ALL, &bytes, &err) == 0,
		 "save: %s", err.msg);
	train(a, 3, 6, la);
	da = gt_param_digest(a);

	b = gt_engine(GT_QWEN2_SMALL, gt_dev_name(), bf16, 999, 1e-3, false);
	gt_check(engine_load_checkpoint(b, dir, CKPT_ALL, &step, &err) == 0, "load: %s", err.msg);
	gt_check(step == 3, "loaded step %lld", (long long)step);
	train(b, 3, 6, lb);
	db = gt_param_digest(b);
	for (int s = 3; s < 6; s++)
		gt_check(memcmp(&la[s], &lb[s], sizeof(double)) == 0,
			 "%s resume: step %d loss %.17g != %.17g", p, s, lb[s], la[s]);
	gt_check(da == db, "%s resume: parameters differ after 3 resumed steps", p);

	c = gt_engine(GT_QWEN2_SMALL, gt_dev_name(), bf16, 21, 1e-3, false);
	train(c, 0, 6, lc);
	dc = gt_param_digest(c);
	gt_check(memcmp(la, lc, sizeof(la)) == 0, "%s: two identical runs give different losses", p);
	gt_check(da == dc, "%s: two identical runs give different parameters", p);
	gt_note("%s: losses %.5f .. %.5f, resumed run identical: %s", p, la[0], la[5],
		da == db ? "yes" : "NO");
	engine_destroy(a);
	engine_destroy(b);
	engine_destroy(c);
}

int main(void)
{
	char tmpl[] = "/tmp/engined-gpu-resume-XXXXXX", dir[600], cmd[700];
	double t0 = gt_now();

	gt_require_gpu("test_gpu_resume");
	if (!mkdtemp(tmpl)) {
		printf("FAIL: mkdtemp\n");
		return 1;
	}
	snprintf(dir, sizeof(dir), "%s/bf16", tmpl);
	run(true, dir);
	snprintf(dir, sizeof(dir), "%s/fp32", tmpl);
	run(false, dir);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpl);
	if (system(cmd) != 0)
		gt_note("could not remove %s", tmpl);
	gt_note("%.1f s", gt_now() - t0);
	return gt_finish("test_gpu_resume");
}
