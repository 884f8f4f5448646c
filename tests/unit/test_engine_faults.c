/* test_engine_faults.c — allocation fault sweeps (STYLE: sqlite's
 * test_malloc): fail the N-th device allocation for every N during
 * engine_create and during a forward_backward that must grow its buffers;
 * each failure must be a clean -ENOMEM (RESOURCE_EXHAUSTED at the daemon)
 * and the engine must stay usable with its state unchanged. */
#include "device/device.h"
#include "test_helpers.h"

START_TEST(create_sweep)
{
	struct engine_init_config cfg;
	int n, failures = 0;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	for (n = 0; n < 200; n++) {
		struct eng_error err = {0};
		struct engine *e = NULL;
		int rc;

		device_fail_allocs_after(n);
		rc = engine_create(&cfg, &e, &err);
		device_fail_allocs_after(-1);
		if (rc == 0) {
			engine_destroy(e);
			break;
		}
		ck_assert_msg(rc == -ENOMEM, "n=%d: rc %d (%s)", n, rc, err.msg);
		ck_assert_ptr_null(e);
		failures++;
	}
	ck_assert_msg(n < 200, "engine_create never succeeded");
	ck_assert_int_ge(failures, 4);   /* params, grads, moments, rope, ... */
}
END_TEST

START_TEST(forward_backward_sweep)
{
	struct engine *e = make_engine(TINY_QWEN2, "language_model", 4, 1e-3);
	int32_t small_lens[1] = {8}, lens[3] = {40, 33, 50}, ids[123];
	float gl[123];
	struct given_grads gg = {.g_logp = gl};
	struct engine_batch b = {.input_ids = ids, .loss_fn = given_loss, .loss_ctx = &gg};
	struct engine_fb_result r = {0};
	struct eng_error err = {0};
	uint64_t p0, g0;
	int n;

	for (int i = 0; i < 123; i++) {
		ids[i] = (i * 37 + 5) % 97;
		gl[i] = (float)((i * 13) % 7) / 7.0f - 0.4f;
	}
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
	b.n = 8;
	b.num_seqs = 1;
	b.seq_lens = small_lens;
	ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), 0);
	p0 = state_digest(e, false);
	g0 = state_digest(e, true);

	/* a larger batch must grow the activation and I/O buffers */
	b.n = 123;
	b.num_seqs = 3;
	b.seq_lens = lens;
	for (n = 0; n < 50; n++) {
		int rc;

		eng_error_clear(&err);
		device_fail_allocs_after(n);
		rc = engine_forward_backward(e, &b, &r, &err);
		device_fail_allocs_after(-1);
		if (rc == 0)
			break;
		ck_assert_msg(rc == -ENOMEM, "n=%d: rc %d (%s)", n, rc, err.msg);
		ck_assert_uint_eq(state_digest(e, false), p0);
		ck_assert_uint_eq(state_digest(e, true), g0);
	}
	ck_assert_msg(n >= 1 && n < 50, "n=%d", n);
	ck_assert_uint_ne(state_digest(e, true), g0);
	engine_destroy(e);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("engine_faults");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, create_sweep);
	tcase_add_test(tc, forward_backward_sweep);
	suite_add_tcase(s, tc);
	return check_run(s);
}
