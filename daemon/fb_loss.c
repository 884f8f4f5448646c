/* fb_loss.c — ForwardBackward's loss spec and loss-library glue (see fb_loss.h). */
#include "fb_loss.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fb_prep_free(void *p)
{
	free(p);
}

int fb_prep_loss(struct fb_prep *p, const Engined__V1__LossSpec *ls, bool value_model,
		 struct eng_error *err)
{
	struct loss_inputs_present present;
	struct eng_error e2;
	int r;

	eng_error_clear(&e2);
	r = loss_spec_init(&p->spec, ls->name, &e2);
	if (r < 0)
		return eng_fail(err, r, "loss.name: %s", e2.msg);
	for (size_t i = 0; i < ls->n_options; i++) {
		const char *key = ls->options[i]->key, *val = ls->options[i]->value;

		eng_error_clear(&e2);
		r = loss_spec_set(&p->spec, key, val, &e2);
		if (r < 0)
			return eng_fail(err, r, "loss.options[%s]: %s", key, e2.msg);
	}
	loss_inputs_present_init(&present, p->batch.n);
	for (int k = 0; k < FB_IN_COUNT; k++)
		present.len[k] = p->in[k] ? p->batch.n : -1;
	present.len[LOSS_IN_ENTROPY] = value_model ? -1 : p->batch.n;
	present.len[LOSS_IN_VALUES] = value_model ? p->batch.n : -1;
	eng_error_clear(&e2);
	r = loss_spec_validate(&p->spec, &present, &e2);
	if (r < 0)
		return eng_fail(err, r, "loss: %s", e2.msg);
	p->has_loss = true;
	return 0;
}

void fb_loss_request(const struct fb_prep *p, struct loss_request *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->n = p->batch.n;
	ret->num_seqs = p->batch.num_seqs;
	ret->seq_lens = p->batch.seq_lens;
	ret->loss_mask = p->in[FB_IN_LOSS_MASK];
	ret->old_log_probs = p->in[FB_IN_OLD_LOG_PROBS];
	ret->ref_log_probs = p->in[FB_IN_REF_LOG_PROBS];
	ret->advantages = p->in[FB_IN_ADVANTAGES];
	ret->returns = p->in[FB_IN_RETURNS];
	ret->old_values = p->in[FB_IN_OLD_VALUES];
	ret->is_weights = p->in[FB_IN_IS_WEIGHTS];
	ret->token_weights = p->in[FB_IN_TOKEN_WEIGHTS];
}

int fb_loss_metrics(const struct loss_engine_ctx *lc, double *ret_loss,
		    Engined__V1__ForwardBackwardResponse__MetricsEntry *entries, int max)
{
	struct loss_metric m[LOSS_M_COUNT];
	int k = 0;

	loss_engine_ctx_result(lc, ret_loss, m);
	for (int i = 0; i < LOSS_M_COUNT && k < max; i++) {
		if (!m[i].present)
			continue;
		engined__v1__forward_backward_response__metrics_entry__init(&entries[k]);
		entries[k].key = (char *)loss_metric_str((enum loss_metric_id)i);
		entries[k].value = m[i].value;
		k++;
	}
	return k;
}
