/* fb_request.h — a ForwardBackwardRequest decoded for the engine: the
 * packed batch (checked by engine_batch_check), the per-token inputs found
 * by the loss library's one table (loss.h's LOSS_REQUEST_INPUTS names the
 * request fields), and the LossSpec parsed into the library's spec, all on
 * the poller thread. The engine side of the loss is the library's adapter
 * (engines/loss/loss_engine.h); this file only translates the wire.
 */
#ifndef ENGINED_DAEMON_FB_REQUEST_H
#define ENGINED_DAEMON_FB_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "engined/v1/engine.pb-c.h"
#include "loss/loss.h"
#include "loss/loss_engine.h"

#define FB_MAX_METRICS LOSS_M_COUNT

/* A decoded ForwardBackward request; arrays borrow the unpacked request. */
struct fb_prep {
	/* n, input_ids, seq_lens, temperature, forward_only, the budget and
	 * (with a loss) loss_fn; loss_ctx is set when the job runs. */
	struct engine_batch batch;
	const float *in[LOSS_IN_REQUEST_COUNT];  /* [n] each, NULL = absent */
	bool has_loss;
	struct loss_spec spec;
};

void fb_prep_free(void *p);  /* accepts NULL */

/* Decode q into p and apply the rules: tensor dtypes, shapes and finite
 * values here; the batch's rules are engine_batch_check's; the loss's
 * loss_spec_validate's (value_model: whether the model yields values).
 * -EINVAL naming the field ("input_ids", "advantages[3]", "loss.name",
 * "loss.options[key]"). */
int fb_request_decode(struct fb_prep *p, const Engined__V1__ForwardBackwardRequest *q,
		      bool value_model, struct eng_error *err);

/* The tensor field of q named `name` (a LOSS_REQUEST_INPUTS name), NULL
 * when unset; *ret_found false when the message has no such field. */
const Engined__V1__Tensor *fb_request_tensor(const Engined__V1__ForwardBackwardRequest *q,
					     const char *name, bool *ret_found);

/* The loss request of p for loss_engine_ctx_init (arrays borrowed). */
void fb_loss_request(const struct fb_prep *p, struct loss_request *ret);

/* Fill entries (key: static string) with the call's metrics from the loss
 * context; returns the count (<= max). */
int fb_loss_metrics(const struct loss_engine_ctx *lc, double *ret_loss,
		    Engined__V1__ForwardBackwardResponse__MetricsEntry *entries, int max);

#endif
