/* engine_calls.h — private to engines/: the engine wrappers' half that runs
 * a call whose request was checked already. engine_request.c runs a
 * prepared ForwardBackward through it: the batch was checked once, by
 * engine_fb_call_prepare, and is not checked again. */
#ifndef ENGINED_ENGINE_CALLS_H
#define ENGINED_ENGINE_CALLS_H

#include "engine.h"

/* engine_forward_backward after engine_batch_check: the mode rule, the
 * call's mode context, the engine's forward_backward. */
int engine_forward_backward_checked(struct engine *e, const struct engine_batch *b,
				    struct engine_fb_result *res, struct eng_error *err);
/* Whether e's model is a value model (its registry row's model_type). */
bool engine_is_value_model(const struct engine *e);

/* A new engine object over ops (no implementation yet), its offload
 * policy `like` another's (NULL: none); free with engine_destroy once the
 * ops are set, or free() before. */
struct engine *engine_new(const struct engine_ops *ops, const struct engine *like);
/* Set e's ops (an adapter's, once its implementation is made). */
void engine_set_ops(struct engine *e, const struct engine_ops *ops);
/* e's ops (the adapter calls reach the implementation through them). */
const struct engine_ops *engine_ops_of(const struct engine *e);

#endif
