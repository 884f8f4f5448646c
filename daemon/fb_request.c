/* fb_request.c — ForwardBackwardRequest decoding (see fb_request.h). */
#include "fb_request.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb_has.h"

void fb_prep_free(void *p)
{
	free(p);
}

const Engined__V1__Tensor *fb_request_tensor(const Engined__V1__ForwardBackwardRequest *q,
					     const char *name, bool *ret_found)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field_by_name(q->base.descriptor, name);

	*ret_found = f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
		     f->descriptor == &engined__v1__tensor__descriptor &&
		     f->label != PROTOBUF_C_LABEL_REPEATED;
	if (!*ret_found)
		return NULL;
	return *(const Engined__V1__Tensor *const *)((const char *)q + f->offset);
}

/* An INT32 token tensor, 1-D, aligned: input_ids (its length is n; absent
 * or empty: n = 0, which the batch check names) or target_ids (length
 * want, or absent). */
static int decode_ids(const Engined__V1__Tensor *t, const char *field, int64_t want,
		      const int32_t **ret, int64_t *ret_n, struct eng_error *err)
{
	int64_t n;

	*ret = NULL;
	*ret_n = 0;
	if (!t || !t->data.len)
		return 0;
	if (t->dtype != ENGINED__V1__DTYPE__INT32)
		return eng_fail(err, -EINVAL, "%s: dtype %d, expected INT32", field, (int)t->dtype);
	if (t->data.len % 4)
		return eng_fail(err, -EINVAL, "%s: %zu bytes is not a whole number of INT32",
				field, t->data.len);
	n = (int64_t)(t->data.len / 4);
	if (t->n_shape > 1 || (t->n_shape == 1 && t->shape[0] != n))
		return eng_fail(err, -EINVAL, "%s: shape must be [%lld] (packed, 1-D)", field,
				(long long)n);
	if (want >= 0 && n != want)
		return eng_fail(err, -EINVAL, "%s: %lld tokens, input_ids has %lld", field,
				(long long)n, (long long)want);
	if (((uintptr_t)t->data.data & 3) != 0)
		return eng_fail(err, -EINVAL, "%s: misaligned data", field);
	*ret = (const int32_t *)t->data.data;
	*ret_n = n;
	return 0;
}

/* An optional per-token tensor: absent when NULL or entirely empty;
 * otherwise FLOAT32 [n] with finite values. *ret_data points into the
 * request (protobuf-c copies bytes into malloc'ed, aligned memory). */
static int decode_per_token(const Engined__V1__Tensor *t, const char *field, int64_t n,
			    const float **ret_data, struct eng_error *err)
{
	const float *v;

	*ret_data = NULL;
	if (!t || (t->dtype == ENGINED__V1__DTYPE__DTYPE_UNSPECIFIED &&
		   t->n_shape == 0 && t->data.len == 0))
		return 0;
	if (t->dtype != ENGINED__V1__DTYPE__FLOAT32)
		return eng_fail(err, -EINVAL, "%s: dtype %d, expected FLOAT32", field,
				(int)t->dtype);
	if (t->n_shape > 1 || (t->n_shape == 1 && t->shape[0] != n))
		return eng_fail(err, -EINVAL, "%s: shape must be [%lld] (input_ids length)",
				field, (long long)n);
	/* n <= the request's bytes / 4: the product cannot overflow. */
	if (t->data.len / 4 != (size_t)n || t->data.len % 4)
		return eng_fail(err, -EINVAL,
				"%s: %zu bytes of data, expected %lld (FLOAT32 [%lld])",
				field, t->data.len, (long long)n * 4, (long long)n);
	if (((uintptr_t)t->data.data & 3) != 0)
		return eng_fail(err, -EINVAL, "%s: misaligned data", field);
	v = (const float *)t->data.data;
	for (int64_t i = 0; i < n; i++)
		if (!isfinite(v[i]))
			return eng_fail(err, -EINVAL, "%s[%lld]: not a finite number (%g)",
					field, (long long)i, (double)v[i]);
	*ret_data = v;
	return 0;
}

static int decode_loss(struct fb_prep *p, const Engined__V1__LossSpec *ls, bool value_model,
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
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
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

int fb_request_decode(struct fb_prep *p, const Engined__V1__ForwardBackwardRequest *q,
		      bool value_model, struct eng_error *err)
{
	bool named_loss = q->loss && q->loss->name[0];
	int64_t tn;
	int r;

	r = decode_ids(q->input_ids, "input_ids", -1, &p->batch.input_ids, &p->batch.n, err);
	if (r == 0)
		r = decode_ids(q->target_ids, "target_ids", p->batch.n, &p->batch.target_ids, &tn,
			       err);
	if (r < 0)
		return r;
	if (q->n_seq_lens > INT32_MAX)
		return eng_fail(err, -EINVAL, "seq_lens: too many sequences");
	p->batch.num_seqs = (int32_t)q->n_seq_lens;
	p->batch.seq_lens = q->seq_lens;
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++) {
		const char *name = loss_inputs[k].name;
		bool found;
		const Engined__V1__Tensor *t = fb_request_tensor(q, name, &found);

		if (!found)  /* the table and the proto disagree: a build mistake */
			return eng_fail(err, -EIO, "ForwardBackwardRequest has no tensor field %s",
					name);
		r = decode_per_token(t, name, p->batch.n, &p->in[k], err);
		if (r < 0)
			return r;
	}
	/* Unset: 1. A temperature that is set must be > 0 (the batch check's
	 * "0 means 1" is for library callers; on the wire 0 is refused). */
	if (PB_HAS(q, temperature) && q->temperature == 0.0f)
		return eng_fail(err, -EINVAL, "temperature: must be > 0 (unset: 1)");
	p->batch.temperature = PB_HAS(q, temperature) ? q->temperature : 1.0f;
	p->batch.forward_only = q->forward_only;
	p->batch.reduce_gradients = q->reduce_gradients;
	p->batch.max_tokens_per_micro_batch = q->max_tokens_per_micro_batch;
	/* The adapter is known now; its context is made when the job runs. */
	p->batch.loss_fn = named_loss ? loss_engine_fn : NULL;
	r = engine_batch_check(&p->batch, err);
	if (r < 0)
		return r;
	return named_loss ? decode_loss(p, q->loss, value_model, err) : 0;
}

void fb_loss_request(const struct fb_prep *p, struct loss_request *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->n = p->batch.n;
	ret->num_seqs = p->batch.num_seqs;
	ret->seq_lens = p->batch.seq_lens;
	memcpy(ret->in, p->in, sizeof(ret->in));
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
