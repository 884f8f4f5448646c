/* engine_request.c — a ForwardBackward request the engine owns (engine.h):
 * the caller states the batch, the per-token inputs by name and the loss
 * as a name and option strings; the engine checks all of it once
 * (engine_fb_call_prepare), runs the call with its own loss library
 * (engines/loss/loss_engine.c) and hands back the loss and the metrics.
 * So a host program (the daemon, tools/engined_demo.c) needs nothing of
 * engines/loss/. */
#include "engine.h"
#include "engine_calls.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "loss/loss.h"
#include "loss/loss_engine.h"

_Static_assert(ENGINE_FB_INPUTS == LOSS_IN_REQUEST_COUNT,
	       "engine.h's ENGINE_FB_INPUTS is the loss library's request inputs");
_Static_assert(ENGINE_FB_MAX_METRICS >= LOSS_M_COUNT,
	       "engine_fb_loss holds every loss metric");

struct engine_fb_call {
	struct engine_fb_request req;
	bool value_model;             /* the model kind it was checked for */
	bool has_loss;
	bool ran;
	struct loss_spec spec;
	struct loss_request lreq;     /* the request's arrays (borrowed) */
	struct loss_engine_ctx lc;    /* made (and the mask checked) at prepare */
};

const char *engine_fb_input_name(int i)
{
	return i >= 0 && i < ENGINE_FB_INPUTS ? loss_inputs[i].name : NULL;
}

/* The loss's name and options into c->spec, checked against the inputs
 * the request carries. */
static int parse_loss(struct engine_fb_call *c, bool value_model, struct eng_error *err)
{
	const struct engine_fb_request *r = &c->req;
	struct loss_inputs_present present;
	struct eng_error e2;
	int rc;

	eng_error_clear(&e2);
	rc = loss_spec_init(&c->spec, r->loss, &e2);
	if (rc < 0)
		return eng_fail(err, rc, "loss.name: %s", e2.msg);
	for (size_t i = 0; i < r->num_options; i++) {
		eng_error_clear(&e2);
		rc = loss_spec_set(&c->spec, r->option_keys[i], r->option_values[i], &e2);
		if (rc < 0)
			return eng_fail(err, rc, "loss.options[%s]: %s", r->option_keys[i], e2.msg);
	}
	loss_inputs_present_init(&present, r->batch.n);
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		present.len[k] = r->inputs[k] ? r->batch.n : -1;
	present.len[LOSS_IN_ENTROPY] = value_model ? -1 : r->batch.n;
	present.len[LOSS_IN_VALUES] = value_model ? r->batch.n : -1;
	eng_error_clear(&e2);
	rc = loss_spec_validate(&c->spec, &present, &e2);
	if (rc < 0)
		return eng_fail(err, rc, "loss: %s", e2.msg);
	c->has_loss = true;
	return 0;
}

int engine_fb_call_prepare(const struct engine_fb_request *r, bool value_model,
			   struct engine_fb_call **ret, struct eng_error *err)
{
	struct engine_fb_call *c;
	int rc;

	if (r->num_options && (!r->option_keys || !r->option_values))
		return eng_fail(err, -EINVAL, "loss.options: missing");
	c = calloc(1, sizeof(*c));
	if (!c)
		return eng_fail(err, -ENOMEM, "ForwardBackward: out of memory");
	c->req = *r;
	c->value_model = value_model;
	c->req.batch.loss_fn = r->loss && r->loss[0] ? loss_engine_fn : NULL;
	c->req.batch.loss_ctx = NULL;
	rc = engine_batch_check(&c->req.batch, err);
	if (rc == 0 && c->req.batch.loss_fn)
		rc = parse_loss(c, value_model, err);
	if (rc == 0 && c->has_loss) {
		c->lreq.n = r->batch.n;
		c->lreq.num_seqs = r->batch.num_seqs;
		c->lreq.seq_lens = r->batch.seq_lens;
		memcpy(c->lreq.in, r->inputs, sizeof(c->lreq.in));
		rc = loss_engine_ctx_init(&c->lc, &c->spec, &c->lreq, err);
		c->req.batch.loss_ctx = &c->lc;
	}
	if (rc) {
		engine_fb_call_free(c);
		return rc;
	}
	*ret = c;
	return 0;
}

void engine_fb_call_free(struct engine_fb_call *c)
{
	if (!c)
		return;
	loss_engine_ctx_destroy(&c->lc);
	free(c);
}

/* The present metrics of the call, named as loss.h names them. */
static void fill_loss(const struct loss_engine_ctx *lc, struct engine_fb_loss *ret)
{
	struct loss_metric m[LOSS_M_COUNT];

	loss_engine_ctx_result(lc, &ret->loss, m);
	for (int i = 0; i < LOSS_M_COUNT; i++) {
		if (!m[i].present)
			continue;
		ret->metrics[ret->num_metrics].name = loss_metric_str((enum loss_metric_id)i);
		ret->metrics[ret->num_metrics].value = m[i].value;
		ret->num_metrics++;
	}
}

int engine_fb_call_run(struct engine *e, struct engine_fb_call *c,
		       struct engine_fb_result *res, struct engine_fb_loss *ret_loss,
		       struct eng_error *err)
{
	int rc;

	if (c->ran)
		return eng_fail(err, -EINVAL, "ForwardBackward: a prepared call runs once");
	/* The engine may have been replaced since the call was checked. */
	if (c->has_loss && engine_is_value_model(e) != c->value_model)
		return eng_fail(err, -EINVAL, "loss: checked for a %s, but the engine now "
				"holds a %s", c->value_model ? "value model" : "language model",
				c->value_model ? "language model" : "value model");
	c->ran = true;
	if (ret_loss)
		memset(ret_loss, 0, sizeof(*ret_loss));
	rc = engine_forward_backward_checked(e, &c->req.batch, res, err);
	if (rc == 0 && c->has_loss && ret_loss)
		fill_loss(&c->lc, ret_loss);
	/* A mixture of experts: the router's auxiliary loss, a metric of its
	 * own, and in the loss with the coefficient training added it with. */
	if (rc == 0 && ret_loss && res->expert_layers > 0 &&
	    ret_loss->num_metrics < ENGINE_FB_MAX_METRICS) {
		ret_loss->metrics[ret_loss->num_metrics].name = "router_aux_loss";
		ret_loss->metrics[ret_loss->num_metrics].value = res->router_aux_loss;
		ret_loss->num_metrics++;
		ret_loss->loss += res->router_aux_coef * res->router_aux_loss;
	}
	return rc;
}
