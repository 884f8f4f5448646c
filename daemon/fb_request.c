/* fb_request.c — ForwardBackwardRequest decoding (see fb_request.h). */
#include "fb_request.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "pb_has.h"

void fb_prep_clear(struct fb_prep *p)
{
	if (!p)
		return;
	engine_fb_call_free(p->call);
	free(p->option_keys);
	free(p->option_values);
	memset(p, 0, sizeof(*p));
}

void fb_prep_free(void *p)
{
	fb_prep_clear(p);
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

int fb_decode_ids(const Engined__V1__Tensor *t, const char *field, int64_t want,
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

/* routed_experts: absent, or INT32 [n, layers, k] (bounds: the batch
 * check's; the model's own shape and ids: the engine's). */
static int decode_routing(const Engined__V1__Tensor *t, struct engine_batch *b,
			  struct eng_error *err)
{
	size_t cells;

	if (!t || (t->n_shape == 0 && t->data.len == 0))
		return 0;
	if (t->dtype != ENGINED__V1__DTYPE__INT32)
		return eng_fail(err, -EINVAL, "routed_experts: dtype %d, expected INT32",
				(int)t->dtype);
	if (t->n_shape != 3 || t->shape[0] != b->n)
		return eng_fail(err, -EINVAL, "routed_experts: shape must be [%lld, layers, "
				"experts_per_tok] (input_ids length first)", (long long)b->n);
	if (t->shape[1] < 1 || t->shape[1] > ENGINE_MAX_LAYERS || t->shape[2] < 1 ||
	    t->shape[2] > ENGINE_MAX_EXPERTS_PER_TOK)
		return eng_fail(err, -EINVAL, "routed_experts: shape [%lld, %lld, %lld]; layers "
				"must be in [1, %d], experts_per_tok in [1, %d]",
				(long long)t->shape[0], (long long)t->shape[1],
				(long long)t->shape[2], ENGINE_MAX_LAYERS,
				ENGINE_MAX_EXPERTS_PER_TOK);
	if (!ck_mul_size((size_t)b->n * (size_t)t->shape[1], (size_t)t->shape[2], &cells) ||
	    t->data.len / 4 != cells || t->data.len % 4)
		return eng_fail(err, -EINVAL, "routed_experts: %zu bytes of data, expected INT32 "
				"[%lld, %lld, %lld]", t->data.len, (long long)b->n,
				(long long)t->shape[1], (long long)t->shape[2]);
	if (((uintptr_t)t->data.data & 3) != 0)
		return eng_fail(err, -EINVAL, "routed_experts: misaligned data");
	b->routed_experts = (const int32_t *)t->data.data;
	b->routed_layers = t->shape[1];
	b->routed_k = t->shape[2];
	return 0;
}

/* The LossSpec as the engine takes it: its name and option strings
 * (borrowed from the request). */
static int decode_loss(struct fb_prep *p, const Engined__V1__LossSpec *ls,
		       struct eng_error *err)
{
	size_t n = ls->n_options;

	p->req.loss = ls->name;
	if (!n)
		return 0;
	p->option_keys = calloc(n, sizeof(*p->option_keys));
	p->option_values = calloc(n, sizeof(*p->option_values));
	if (!p->option_keys || !p->option_values)
		return eng_fail(err, -ENOMEM, "loss.options: out of memory");
	for (size_t i = 0; i < n; i++) {
		p->option_keys[i] = ls->options[i]->key;
		p->option_values[i] = ls->options[i]->value;
	}
	p->req.num_options = n;
	p->req.option_keys = p->option_keys;
	p->req.option_values = p->option_values;
	return 0;
}

int fb_request_decode(struct fb_prep *p, const Engined__V1__ForwardBackwardRequest *q,
		      bool value_model, struct eng_error *err)
{
	struct engine_batch *b = &p->req.batch;
	int64_t tn;
	int r;

	r = fb_decode_ids(q->input_ids, "input_ids", -1, &b->input_ids, &b->n, err);
	if (r == 0)
		r = fb_decode_ids(q->target_ids, "target_ids", b->n, &b->target_ids, &tn, err);
	if (r < 0)
		return r;
	if (q->n_seq_lens > INT32_MAX)
		return eng_fail(err, -EINVAL, "seq_lens: too many sequences");
	b->num_seqs = (int32_t)q->n_seq_lens;
	b->seq_lens = q->seq_lens;
	for (int k = 0; k < ENGINE_FB_INPUTS; k++) {
		const char *name = engine_fb_input_name(k);
		bool found;
		const Engined__V1__Tensor *t = fb_request_tensor(q, name, &found);

		if (!found)  /* the engine and the proto disagree: a build mistake */
			return eng_fail(err, -EIO, "ForwardBackwardRequest has no tensor field %s",
					name);
		r = decode_per_token(t, name, b->n, &p->req.inputs[k], err);
		if (r < 0)
			return r;
	}
	/* Unset: 1. A temperature that is set must be > 0 (the batch check's
	 * "0 means 1" is for library callers; on the wire 0 is refused). */
	if (PB_HAS(q, temperature) && q->temperature == 0.0f)
		return eng_fail(err, -EINVAL, "temperature: must be > 0 (unset: 1)");
	b->temperature = PB_HAS(q, temperature) ? q->temperature : 1.0f;
	b->forward_only = q->forward_only;
	b->reduce_gradients = q->reduce_gradients;
	if (q->_activation_recompute_case ==
	    ENGINED__V1__FORWARD_BACKWARD_REQUEST___ACTIVATION_RECOMPUTE_ACTIVATION_RECOMPUTE)
		b->activation_recompute = q->activation_recompute ? ENGINE_RECOMPUTE_ON
								  : ENGINE_RECOMPUTE_OFF;
	b->max_tokens_per_micro_batch = q->max_tokens_per_micro_batch;
	if ((r = decode_routing(q->routed_experts, b, err)) < 0)
		return r;
	if (q->loss && q->loss->name[0] && (r = decode_loss(p, q->loss, err)) < 0)
		return r;
	return engine_fb_call_prepare(&p->req, value_model, &p->call, err);
}
