/* fb_request.h — a ForwardBackwardRequest decoded into the engine's own
 * request (engine.h, struct engine_fb_request): the packed batch, the
 * per-token inputs by the engine's names (engine_fb_input_name: the
 * request fields of the same names), and the LossSpec as its name and
 * option strings; the engine then checks it once (engine_fb_call_prepare)
 * and runs its own loss. All on the poller thread; this file only
 * translates the wire.
 */
#ifndef ENGINED_DAEMON_FB_REQUEST_H
#define ENGINED_DAEMON_FB_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "engined/v1/engine.pb-c.h"

#define FB_MAX_METRICS ENGINE_FB_MAX_METRICS

/* A decoded ForwardBackward request; arrays and strings borrow the
 * unpacked request, which outlives it. */
struct fb_prep {
	/* n, input_ids, seq_lens, temperature, forward_only, the budget, the
	 * inputs and the loss; the caller sets the batch's hooks first. */
	struct engine_fb_request req;
	const char **option_keys, **option_values;   /* owned arrays */
	struct engine_fb_call *call;                  /* owned; the checked request */
};

/* Free what p owns and zero it (p stays allocated); fb_prep_free frees p
 * too (the job's prep_free). Both accept NULL. */
void fb_prep_clear(struct fb_prep *p);
void fb_prep_free(void *p);

/* Decode q into p->req and have the engine check it (p->call): tensor
 * dtypes, shapes and finite values here; the batch's and the loss's rules
 * the engine's (value_model: whether the model yields values). -EINVAL
 * naming the field ("input_ids", "advantages[3]", "loss.name",
 * "loss.options[key]"). */
int fb_request_decode(struct fb_prep *p, const Engined__V1__ForwardBackwardRequest *q,
		      bool value_model, struct eng_error *err);

/* An INT32 token tensor, 1-D, aligned (ForwardBackward's input_ids and
 * target_ids, Sample's input_ids): its length in *ret_n (absent or empty:
 * 0, which the batch check names), want (>= 0) when given. -EINVAL naming
 * field. */
int fb_decode_ids(const Engined__V1__Tensor *t, const char *field, int64_t want,
		  const int32_t **ret, int64_t *ret_n, struct eng_error *err);

/* The tensor field of q named `name` (an engine_fb_input_name), NULL when
 * unset; *ret_found false when the message has no such field. */
const Engined__V1__Tensor *fb_request_tensor(const Engined__V1__ForwardBackwardRequest *q,
					     const char *name, bool *ret_found);

#endif
