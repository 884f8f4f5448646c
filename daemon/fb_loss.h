/* fb_loss.h — ForwardBackward's validated request and its loss: parsing the
 * LossSpec into the loss library's spec (engines/loss/loss.h) on the poller
 * thread, and the glue to the library's engine adapter
 * (engines/loss/loss_engine.h), which the engine calls per micro-batch.
 */
#ifndef ENGINED_DAEMON_FB_LOSS_H
#define ENGINED_DAEMON_FB_LOSS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "engined/v1/engine.pb-c.h"
#include "loss/loss.h"
#include "loss/loss_engine.h"

/* Request arrays, in the order of loss.h's enum loss_input. */
enum {
	FB_IN_LOSS_MASK = 0,
	FB_IN_OLD_LOG_PROBS,
	FB_IN_REF_LOG_PROBS,
	FB_IN_ADVANTAGES,
	FB_IN_RETURNS,
	FB_IN_OLD_VALUES,
	FB_IN_IS_WEIGHTS,
	FB_IN_TOKEN_WEIGHTS,
	FB_IN_COUNT,
};

#define FB_MAX_METRICS LOSS_M_COUNT

/* A validated ForwardBackward request; arrays borrow the unpacked request. */
struct fb_prep {
	/* n, input_ids, seq_lens, temperature, forward_only, the budget and
	 * (with a loss) loss_fn, checked by engine_batch_check; loss_ctx is
	 * set when the job runs. */
	struct engine_batch batch;
	const float *in[FB_IN_COUNT];   /* [n] each, NULL = absent */
	bool has_loss;
	struct loss_spec spec;
};

void fb_prep_free(void *p);  /* accepts NULL */

/* Parse and validate the loss of the request into p->spec. value_model
 * says whether the model yields values. -EINVAL naming "loss.name" or
 * "loss.options[key]" or the missing input. */
int fb_prep_loss(struct fb_prep *p, const Engined__V1__LossSpec *ls, bool value_model,
		 struct eng_error *err);

/* The loss request of p for loss_engine_ctx_init (arrays borrowed). */
void fb_loss_request(const struct fb_prep *p, struct loss_request *ret);

/* Fill entries (key: static string) with the call's metrics from the loss
 * context; returns the count (<= max). */
int fb_loss_metrics(const struct loss_engine_ctx *lc, double *ret_loss,
		    Engined__V1__ForwardBackwardResponse__MetricsEntry *entries, int max);

#endif
