/* test_fb_request.c — ForwardBackwardRequest decoding (daemon/fb_request.c)
 * into the engine's request against the engine's one list of per-token
 * inputs (engine_fb_input_name): the list and the proto name the same
 * tensors, and each rule answers with its field. */
#include "check_run.h"
#include <check.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "fb_request.h"

/* Every table input is a Tensor field of the request, and every Tensor
 * field of the request but input_ids is in the table. */
START_TEST(table_matches_proto)
{
	const ProtobufCMessageDescriptor *md = &engined__v1__forward_backward_request__descriptor;
	Engined__V1__ForwardBackwardRequest q = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	int tensors = 0;

	for (int k = 0; k < ENGINE_FB_INPUTS; k++) {
		bool found;

		fb_request_tensor(&q, engine_fb_input_name(k), &found);
		ck_assert_msg(found, "%s is not a Tensor field", engine_fb_input_name(k));
	}
	ck_assert_ptr_null(engine_fb_input_name(ENGINE_FB_INPUTS));
	for (unsigned i = 0; i < md->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &md->fields[i];
		bool in_table = false;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->descriptor != &engined__v1__tensor__descriptor)
			continue;
		tensors++;
		for (int k = 0; k < ENGINE_FB_INPUTS; k++)
			in_table |= !strcmp(engine_fb_input_name(k), f->name);
		/* input_ids, target_ids and routed_experts are the engine's,
		 * the rest the loss's. */
		ck_assert_msg(in_table || !strcmp(f->name, "input_ids") ||
			      !strcmp(f->name, "target_ids") || !strcmp(f->name, "routed_experts"),
			      "request tensor %s is missing from the engine's inputs", f->name);
	}
	ck_assert_int_eq(tensors, ENGINE_FB_INPUTS + 3);
}
END_TEST

/* The decoded input named `name`. */
static const float *input(const struct fb_prep *p, const char *name)
{
	for (int k = 0; k < ENGINE_FB_INPUTS; k++)
		if (!strcmp(engine_fb_input_name(k), name))
			return p->req.inputs[k];
	ck_abort_msg("no input %s", name);
	return NULL;
}

static Engined__V1__Tensor tensor(Engined__V1__DType dt, int64_t *shape, void *data, size_t len)
{
	Engined__V1__Tensor t = ENGINED__V1__TENSOR__INIT;

	t.dtype = dt;
	t.n_shape = 1;
	t.shape = shape;
	t.data.data = data;
	t.data.len = len;
	return t;
}

START_TEST(decode_and_rules)
{
	int32_t ids[6] = { 1, 2, 3, 4, 5, 6 }, lens[2] = { 2, 4 };
	float adv[6] = { 0, 1, 2, 3, 4, 5 }, mask[6] = { 0, 1, 1, 0, 1, 1 };
	int64_t n = 6;
	Engined__V1__Tensor t_ids = tensor(ENGINED__V1__DTYPE__INT32, &n, ids, sizeof(ids));
	Engined__V1__Tensor t_adv = tensor(ENGINED__V1__DTYPE__FLOAT32, &n, adv, sizeof(adv));
	Engined__V1__Tensor t_mask = tensor(ENGINED__V1__DTYPE__FLOAT32, &n, mask, sizeof(mask));
	Engined__V1__ForwardBackwardRequest q = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__LossSpec ls = ENGINED__V1__LOSS_SPEC__INIT;
	struct fb_prep p;
	struct eng_error err = { 0 };

	q.input_ids = &t_ids;
	q.n_seq_lens = 2;
	q.seq_lens = lens;
	q.advantages = &t_adv;
	q.loss_mask = &t_mask;
	q.forward_only = true;
	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), 0);
	ck_assert_int_eq(p.req.batch.n, 6);
	ck_assert_ptr_eq(input(&p, "advantages"), adv);
	ck_assert_ptr_eq(input(&p, "loss_mask"), mask);
	ck_assert_ptr_null(input(&p, "old_log_probs"));
	ck_assert_ptr_null(p.req.loss);
	ck_assert_ptr_nonnull(p.call);

	/* A non-finite input names its field and index. */
	adv[3] = NAN;
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "advantages[3]: not a finite number (nan)");
	adv[3] = 3;

	/* The batch's rules are engine_batch_check's. */
	eng_error_clear(&err);
	q.max_tokens_per_micro_batch = INT64_MAX;
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "max_tokens_per_micro_batch"));
	q.max_tokens_per_micro_batch = 0;
	eng_error_clear(&err);
	q.reduce_gradients = true;      /* with forward_only */
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "reduce_gradients: a forward_only call has no gradients "
			 "to reduce");
	q.reduce_gradients = false;
	eng_error_clear(&err);
	q.forward_only = false;
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "loss.name: a loss is required unless forward_only");

	/* A loss: its spec and inputs are checked (ppo needs old_log_probs). */
	eng_error_clear(&err);
	ls.name = "ppo";
	q.loss = &ls;
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "old_log_probs"));
	eng_error_clear(&err);
	ls.name = "sft";
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), 0);
	ck_assert_str_eq(p.req.loss, "sft");
	ck_assert_ptr_nonnull(p.call);

	/* Wrong dtype and length of a per-token input. */
	t_adv.dtype = ENGINED__V1__DTYPE__INT32;
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "advantages: dtype"));
	eng_error_clear(&err);
	t_adv.dtype = ENGINED__V1__DTYPE__FLOAT32;
	t_adv.data.len = 5 * 4;
	t_adv.n_shape = 0;
	fb_prep_clear(&p);
	ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "advantages: 20 bytes"));
	fb_prep_clear(&p);

	/* Options reach the engine's parser, which names the key. */
	t_adv.data.len = sizeof(adv);
	t_adv.n_shape = 1;
	{
		Engined__V1__LossSpec__OptionsEntry o = ENGINED__V1__LOSS_SPEC__OPTIONS_ENTRY__INIT;
		Engined__V1__LossSpec__OptionsEntry *opts[1] = { &o };

		o.key = "loss_agg_mode";
		o.value = "no-such-mode";
		ls.n_options = 1;
		ls.options = opts;
		eng_error_clear(&err);
		ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
		ck_assert_ptr_nonnull(strstr(err.msg, "loss.options[loss_agg_mode]: "));
		fb_prep_clear(&p);
		o.value = "token-mean";
		ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), 0);
		fb_prep_clear(&p);
	}

	/* routed_experts: INT32 [n, layers, k], bounded; the model's own
	 * rules are the engine's */
	{
		int32_t routes[6 * 2 * 2] = {0};
		int64_t shape[3] = {6, 2, 2};
		Engined__V1__Tensor t_r = tensor(ENGINED__V1__DTYPE__INT32, shape, routes,
						 sizeof(routes));
		static const struct { int64_t s0, s1, s2; size_t len; int dt; const char *want; }
		bad[] = {
			{6, 2, 2, 96, ENGINED__V1__DTYPE__INT64, "routed_experts: dtype"},
			{5, 2, 2, 96, ENGINED__V1__DTYPE__INT32, "routed_experts: shape must be [6,"},
			{6, 2, 65, 96, ENGINED__V1__DTYPE__INT32, "experts_per_tok in [1, 64]"},
			{6, 1025, 2, 96, ENGINED__V1__DTYPE__INT32, "layers must be in [1, 1024]"},
			{6, 2, 2, 92, ENGINED__V1__DTYPE__INT32, "routed_experts: 92 bytes of data"},
		};

		ls.n_options = 0;
		t_r.n_shape = 3;
		q.routed_experts = &t_r;
		eng_error_clear(&err);
		ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), 0);
		ck_assert_ptr_eq(p.req.batch.routed_experts, routes);
		ck_assert(p.req.batch.routed_layers == 2 && p.req.batch.routed_k == 2);
		fb_prep_clear(&p);
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			shape[0] = bad[i].s0;
			shape[1] = bad[i].s1;
			shape[2] = bad[i].s2;
			t_r.data.len = bad[i].len;
			t_r.dtype = bad[i].dt;
			eng_error_clear(&err);
			ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
			ck_assert_msg(strstr(err.msg, bad[i].want), "%zu: %s", i, err.msg);
			fb_prep_clear(&p);
		}
		t_r.n_shape = 2;
		ck_assert_int_eq(fb_request_decode(&p, &q, false, &err), -EINVAL);
		fb_prep_clear(&p);
		q.routed_experts = NULL;
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fb_request");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, table_matches_proto);
	tcase_add_test(tc, decode_and_rules);
	suite_add_tcase(s, tc);
	return check_run(s);
}
