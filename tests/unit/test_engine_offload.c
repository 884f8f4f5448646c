/* test_engine_offload.c — real offload on a device with its own memory.
 *
 * The CPU device opened with ENGINED_CPU_DISCRETE=1 keeps device and host
 * allocations apart (as CUDA does), so these tests drive the engine's
 * generic placement code: device memory really comes back when state moves
 * to the host, training after moving back gives bit-identical results to an
 * engine that never moved, and failed moves leave the state usable. */
#include <stdlib.h>

#include "device/device.h"
#include "io/safetensors.h"
#include "test_helpers.h"

static struct engine *make(bool offload)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.seed = 3;
	cfg.optim.lr = 1e-2;
	cfg.param_offload = offload;
	cfg.optimizer_offload = offload;
	ck_assert_msg(engine_create(&cfg, &e, &err) == 0, "%s", err.msg);
	return e;
}

static void step(struct engine *e, int k)
{
	int32_t lens[2] = {9, 6}, ids[15];
	float gl[15];
	struct given_grads gg = {.g_logp = gl};
	struct engine_batch b = {.n = 15, .input_ids = ids, .num_seqs = 2, .seq_lens = lens,
				 .loss_fn = given_loss, .loss_ctx = &gg};
	struct engine_fb_result r = {0};
	struct engine_step_result sr;
	struct eng_error err = {0};

	for (int i = 0; i < 15; i++) {
		ids[i] = (i * 31 + k * 7) % 97;
		gl[i] = (float)((i + k) % 5) / 5.0f - 0.4f;
	}
	ck_assert_msg(engine_forward_backward(e, &b, &r, &err) == 0, "%s", err.msg);
	ck_assert_msg(engine_optimizer_step(e, &sr, &err) == 0, "%s", err.msg);
	ck_assert(!sr.skipped);
}

START_TEST(offload_frees_device_memory_and_trains_identically)
{
	struct engine *a, *b;
	struct engine_status st;
	struct eng_error err = {0};
	size_t fam;

	setenv("ENGINED_CPU_DISCRETE", "1", 1);
	a = make(true);
	unsetenv("ENGINED_CPU_DISCRETE");
	b = make(false);
	ck_assert_uint_eq(state_digest(a, false), state_digest(b, false));

	engine_status(a, &st);
	fam = (size_t)st.num_parameters * sizeof(float);
	ck_assert(!st.placement.model && !st.placement.optimizer && !st.placement.grad);
	ck_assert_uint_eq(st.host_memory, 4 * fam);
	ck_assert_msg(st.device_memory < fam / 4, "device memory %zu", st.device_memory);

	/* per-call contexts move state in and out around each call */
	for (int k = 0; k < 3; k++) {
		step(a, k);
		step(b, k);
		engine_status(a, &st);
		ck_assert(!st.placement.model);
		ck_assert_msg(st.device_memory < fam / 4, "device memory %zu after step %d",
			      st.device_memory, k);
	}
	ck_assert_uint_eq(state_digest(a, false), state_digest(b, false));

	/* SetMode(TRAIN) makes everything resident; IDLE gives it back */
	ck_assert_int_eq(engine_set_mode(a, ENGINE_MODE_TRAIN, false, &err), 0);
	engine_status(a, &st);
	ck_assert(st.placement.model && st.placement.optimizer && st.placement.grad);
	ck_assert_uint_ge(st.device_memory, 4 * fam);
	ck_assert_uint_eq(st.host_memory, 0);
	step(a, 7);
	step(b, 7);
	ck_assert_int_eq(engine_set_mode(a, ENGINE_MODE_IDLE, false, &err), 0);
	engine_status(a, &st);
	ck_assert_msg(st.device_memory < fam / 4, "device memory %zu", st.device_memory);
	ck_assert_uint_eq(state_digest(a, false), state_digest(b, false));
	engine_destroy(a);
	engine_destroy(b);
}
END_TEST

START_TEST(offloaded_state_is_readable_and_guarded)
{
	struct engine *a;
	struct engine_param_view v;
	struct eng_error err = {0};
	uint16_t h[32];
	int32_t lens[1] = {4}, ids[4] = {1, 2, 3, 4};
	struct engine_batch b = {.n = 4, .input_ids = ids, .num_seqs = 1, .seq_lens = lens,
				 .forward_only = true};
	struct engine_fb_result r = {0};

	setenv("ENGINED_CPU_DISCRETE", "1", 1);
	a = make(true);
	unsetenv("ENGINED_CPU_DISCRETE");
	/* parameter views and conversions read the host copy */
	ck_assert_int_eq(engine_param(a, 1, &v, &err), 0);
	ck_assert_int_eq(engine_param_copy(a, 1, ENGINE_DTYPE_BF16, 0, 32, h, &err), 0);
	for (int j = 0; j < 32; j++)
		ck_assert_uint_eq(h[j], f32_to_bf16(v.host_data[j]));

	/* with auto-offload disabled nothing moves, so compute is refused */
	ck_assert_int_eq(engine_set_mode(a, ENGINE_MODE_EVAL, true, &err), 0);
	ck_assert_int_eq(engine_forward_backward(a, &b, &r, &err), -EALREADY);
	ck_assert_msg(strstr(err.msg, "placement"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_to(a, true, true, false, false, &err), 0);
	ck_assert_int_eq(engine_forward_backward(a, &b, &r, &err), 0);
	ck_assert_int_eq(engine_set_mode(a, ENGINE_MODE_IDLE, false, &err), 0);
	engine_destroy(a);
}
END_TEST

/* A move that runs out of device memory fails cleanly and can be retried. */
START_TEST(failed_move_keeps_state)
{
	struct engine *a;
	struct engine_status st;
	struct eng_error err = {0};
	uint64_t p0;

	setenv("ENGINED_CPU_DISCRETE", "1", 1);
	a = make(true);
	unsetenv("ENGINED_CPU_DISCRETE");
	p0 = state_digest(a, false);
	for (int n = 0; n < 4; n++) {
		eng_error_clear(&err);
		device_fail_allocs_after(n);
		ck_assert_int_eq(engine_to(a, true, true, true, true, &err), -ENOMEM);
		device_fail_allocs_after(-1);
		ck_assert_msg(strstr(err.msg, "out of device memory"), "%s", err.msg);
		ck_assert_uint_eq(state_digest(a, false), p0);
		engine_status(a, &st);
		/* each family is where the flags say */
		ck_assert(st.placement.model == (n >= 1));
		ck_assert(st.placement.grad == (n >= 2));
		ck_assert(!st.placement.optimizer);
		ck_assert_int_eq(engine_to(a, false, true, true, true, &err), 0);
	}
	ck_assert_int_eq(engine_to(a, true, true, true, true, &err), 0);
	engine_status(a, &st);
	ck_assert(st.placement.model && st.placement.grad && st.placement.optimizer);
	ck_assert_uint_eq(state_digest(a, false), p0);
	step(a, 1);
	engine_destroy(a);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("engine_offload");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, offload_frees_device_memory_and_trains_identically);
	tcase_add_test(tc, offloaded_state_is_readable_and_guarded);
	tcase_add_test(tc, failed_move_keeps_state);
	suite_add_tcase(s, tc);
	return check_run(s);
}
