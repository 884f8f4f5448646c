/* loss_driver.c — runs the loss library on cases written by loss_ref.py.
 *
 * Usage: loss_driver CASES.json OUT.json
 *
 * CASES.json is a list of cases:
 *   { "id": str, "name": str, "options": [[key, text], ...],
 *     "seq_lens": [int], "arrays": { "log_probs": [..], "loss_mask": [..], ... },
 *     "norm": {"tokens": x, "seqs": y, "horizon": z},   (optional, compute mode)
 *     "rng_seed": int,                                   (optional)
 *     "calls": [[[seq, ...], ...], ...] }                (optional: engine mode)
 * Without "calls" the case runs loss_compute once on the whole batch. With
 * "calls" each call is a list of micro-batches (request sequence indices);
 * every call gets its own loss_engine_ctx over the sequences it names, the
 * driver plays the engine (gathers model outputs in micro-batch order,
 * scatters gradients back) and the results of all calls are combined as a
 * controller would: losses and contributions summed, means token-weighted.
 *
 * OUT.json: a list of { "id", "rc", "err", "loss", "metrics": {name: value},
 * "d_log_probs", "d_entropy", "d_values", "selected" } in full-batch order.
 * Spec options go through loss_spec_set and loss_spec_validate, so parse
 * errors come back as rc/err too.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loss/loss.h"
#include "loss/loss_engine.h"

struct full {
	int64_t n;
	int32_t num_seqs;
	int32_t *seq_lens;
	int64_t *seq_off;
	float *log_probs, *entropy, *values;
	float *in[LOSS_IN_REQUEST_COUNT];  /* loss.h's table order */
};

static float *read_floats(json_t *arrays, const char *name, int64_t n)
{
	json_t *a = json_object_get(arrays, name);
	float *v;

	if (!a)
		return NULL;
	if (!json_is_array(a) || (int64_t)json_array_size(a) != n) {
		fprintf(stderr, "loss_driver: array %s has the wrong length\n", name);
		exit(2);
	}
	v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	if (!v)
		exit(3);
	for (int64_t i = 0; i < n; i++)
		v[i] = (float)json_number_value(json_array_get(a, (size_t)i));
	return v;
}

static json_t *floats_json(const float *v, int64_t n)
{
	json_t *a = json_array();

	for (int64_t i = 0; i < n; i++)
		json_array_append_new(a, json_real((double)v[i]));
	return a;
}

static void free_full(struct full *f)
{
	free(f->seq_lens);
	free(f->seq_off);
	free(f->log_probs);
	free(f->entropy);
	free(f->values);
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		free(f->in[k]);
}

static void put_metrics(json_t *out, const struct loss_metric *m)
{
	json_t *mo = json_object();

	for (int k = 0; k < LOSS_M_COUNT; k++)
		if (m[k].present)
			json_object_set_new(mo, loss_metric_str((enum loss_metric_id)k),
					    json_real(m[k].value));
	json_object_set_new(out, "metrics", mo);
}

static int run_compute(const struct loss_spec *s, const struct full *f, json_t *c,
		       json_t *out, struct eng_error *err)
{
	struct loss_batch b = {0};
	struct loss_result res = {0};
	json_t *norm = json_object_get(c, "norm");
	size_t sz = (size_t)(f->n > 0 ? f->n : 1);
	float *dl = calloc(sz, 4), *de = calloc(sz, 4), *dv = calloc(sz, 4);
	uint8_t *sel = calloc(sz, 1);
	json_t *sj;
	int r;

	if (!dl || !de || !dv || !sel)
		exit(3);
	b.n = f->n;
	b.num_seqs = f->num_seqs;
	b.seq_lens = f->seq_lens;
	b.log_probs = f->log_probs;
	b.entropy = f->entropy;
	b.values = f->values;
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		b.in[k] = f->in[k];
	if (norm) {
		b.norm_tokens = json_number_value(json_object_get(norm, "tokens"));
		b.norm_seqs = json_number_value(json_object_get(norm, "seqs"));
		b.norm_horizon = json_number_value(json_object_get(norm, "horizon"));
	}
	b.rng_seed = (uint64_t)json_integer_value(json_object_get(c, "rng_seed"));
	res.d_log_probs = dl;
	res.d_entropy = de;
	res.d_values = dv;
	res.selected = sel;
	r = loss_compute(s, &b, &res, err);
	if (r == 0) {
		json_object_set_new(out, "loss", json_real(res.loss));
		put_metrics(out, res.metrics);
		json_object_set_new(out, "d_log_probs", floats_json(dl, f->n));
		json_object_set_new(out, "d_entropy", floats_json(de, f->n));
		json_object_set_new(out, "d_values", floats_json(dv, f->n));
		sj = json_array();
		for (int64_t i = 0; i < f->n; i++)
			json_array_append_new(sj, json_integer(sel[i]));
		json_object_set_new(out, "selected", sj);
	}
	free(dl);
	free(de);
	free(dv);
	free(sel);
	return r;
}

/* One ForwardBackward call over request sequences `seqs` (sorted), with the
 * micro-batches `mbs`; gradients land in full-batch positions. */
static int run_call(const struct loss_spec *s, const struct full *f, json_t *mbs,
		    uint64_t seed, float *gl, float *ge, float *gv,
		    double *ret_loss, struct loss_metric *ret_m, struct eng_error *err)
{
	int32_t nseq = 0, *call_seq_of = NULL, *req_seq = NULL, *lens = NULL;
	int64_t n = 0, *call_off = NULL, *full_pos = NULL;
	struct loss_request q = {0};
	struct loss_engine_ctx lc;
	float *arr[LOSS_IN_REQUEST_COUNT] = {0};
	size_t imb, isq;
	json_t *mb, *sq;
	int r = 0;

	/* The call's sequences, in request order. */
	call_seq_of = malloc((size_t)f->num_seqs * sizeof(int32_t));
	req_seq = malloc((size_t)f->num_seqs * sizeof(int32_t));
	lens = malloc((size_t)f->num_seqs * sizeof(int32_t));
	call_off = malloc((size_t)f->num_seqs * sizeof(int64_t));
	full_pos = malloc((size_t)(f->n > 0 ? f->n : 1) * sizeof(int64_t));
	if (!call_seq_of || !req_seq || !lens || !call_off || !full_pos)
		exit(3);
	for (int32_t i = 0; i < f->num_seqs; i++)
		call_seq_of[i] = -1;
	json_array_foreach(mbs, imb, mb)
		json_array_foreach(mb, isq, sq)
			call_seq_of[json_integer_value(sq)] = 1;
	for (int32_t i = 0; i < f->num_seqs; i++) {
		if (call_seq_of[i] < 0)
			continue;
		call_seq_of[i] = nseq;
		req_seq[nseq] = i;
		lens[nseq] = f->seq_lens[i];
		call_off[nseq] = n;
		for (int32_t j = 0; j < f->seq_lens[i]; j++)
			full_pos[n + j] = f->seq_off[i] + j;
		n += f->seq_lens[i];
		nseq++;
	}
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++) {
		if (!f->in[k])
			continue;
		arr[k] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
		if (!arr[k])
			exit(3);
		for (int64_t t = 0; t < n; t++)
			arr[k][t] = f->in[k][full_pos[t]];
	}
	q.n = n;
	q.num_seqs = nseq;
	q.seq_lens = lens;
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		q.in[k] = arr[k];
	r = loss_engine_ctx_init(&lc, s, &q, err);
	if (r)
		goto out;
	lc.rng_seed = seed;

	json_array_foreach(mbs, imb, mb) {
		int32_t mseq = (int32_t)json_array_size(mb), *mlens, *midx;
		int64_t mn = 0, *tok;
		float *lp, *en, *va, *dl, *de, *dv;
		struct engine_loss_io io = {0};

		json_array_foreach(mb, isq, sq)
			mn += f->seq_lens[json_integer_value(sq)];
		mlens = malloc(((size_t)mseq + 1) * sizeof(int32_t));
		midx = malloc(((size_t)mseq + 1) * sizeof(int32_t));
		tok = malloc(((size_t)mn + 1) * sizeof(int64_t));
		lp = malloc(((size_t)mn + 1) * 4);
		en = malloc(((size_t)mn + 1) * 4);
		va = malloc(((size_t)mn + 1) * 4);
		dl = malloc(((size_t)mn + 1) * 4);
		de = malloc(((size_t)mn + 1) * 4);
		dv = malloc(((size_t)mn + 1) * 4);
		if (!mlens || !midx || !tok || !lp || !en || !va || !dl || !de || !dv)
			exit(3);
		mn = 0;
		json_array_foreach(mb, isq, sq) {
			int32_t rs = (int32_t)json_integer_value(sq), cs = call_seq_of[rs];

			mlens[isq] = f->seq_lens[rs];
			midx[isq] = cs;
			for (int32_t j = 0; j < f->seq_lens[rs]; j++, mn++) {
				int64_t fp = f->seq_off[rs] + j;

				tok[mn] = call_off[cs] + j;
				lp[mn] = f->log_probs ? f->log_probs[fp] : 0.0f;
				en[mn] = f->entropy ? f->entropy[fp] : 0.0f;
				va[mn] = f->values ? f->values[fp] : 0.0f;
			}
		}
		io.n = mn;
		io.num_seqs = mseq;
		io.seq_lens = mlens;
		io.seq_index = midx;
		io.token_index = tok;
		io.log_probs = f->log_probs ? lp : NULL;
		io.entropy = f->entropy ? en : NULL;
		io.values = f->values ? va : NULL;
		io.d_log_probs = dl;
		io.d_entropy = de;
		io.d_values = f->values ? dv : NULL;
		r = loss_engine_fn(&lc, &io, err);
		if (r == 0) {
			for (int64_t i = 0; i < mn; i++) {
				int64_t fp = full_pos[tok[i]];

				gl[fp] = dl[i];
				ge[fp] = de[i];
				if (f->values)
					gv[fp] = dv[i];
			}
		}
		free(mlens);
		free(midx);
		free(tok);
		free(lp);
		free(en);
		free(va);
		free(dl);
		free(de);
		free(dv);
		if (r)
			break;
	}
	if (r == 0)
		loss_engine_ctx_result(&lc, ret_loss, ret_m);
	loss_engine_ctx_destroy(&lc);
out:
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		free(arr[k]);
	free(call_seq_of);
	free(req_seq);
	free(lens);
	free(call_off);
	free(full_pos);
	return r;
}

static int run_engine(const struct loss_spec *s, const struct full *f, json_t *c,
		      json_t *out, struct eng_error *err)
{
	size_t sz = (size_t)(f->n > 0 ? f->n : 1), ic;
	float *gl = calloc(sz, 4), *ge = calloc(sz, 4), *gv = calloc(sz, 4);
	struct loss_metric total[LOSS_M_COUNT] = {0};
	double msum[LOSS_M_COUNT] = {0}, mw[LOSS_M_COUNT] = {0}, loss = 0;
	uint64_t seed = (uint64_t)json_integer_value(json_object_get(c, "rng_seed"));
	json_t *call;
	int r = 0;

	if (!gl || !ge || !gv)
		exit(3);
	json_array_foreach(json_object_get(c, "calls"), ic, call) {
		struct loss_metric m[LOSS_M_COUNT];
		double l = 0;

		r = run_call(s, f, call, seed + ic, gl, ge, gv, &l, m, err);
		if (r)
			break;
		loss += l;
		for (int k = 0; k < LOSS_M_COUNT; k++) {
			if (!m[k].present)
				continue;
			total[k].present = true;
			if (loss_metric_is_mean((enum loss_metric_id)k)) {
				msum[k] += m[k].value * m[k].weight;
				mw[k] += m[k].weight;
			} else {
				msum[k] += m[k].value;
			}
		}
	}
	if (r == 0) {
		for (int k = 0; k < LOSS_M_COUNT; k++)
			total[k].value = loss_metric_is_mean((enum loss_metric_id)k) ?
					 (mw[k] > 0 ? msum[k] / mw[k] : 0.0) : msum[k];
		json_object_set_new(out, "loss", json_real(loss));
		put_metrics(out, total);
		json_object_set_new(out, "d_log_probs", floats_json(gl, f->n));
		json_object_set_new(out, "d_entropy", floats_json(ge, f->n));
		json_object_set_new(out, "d_values", floats_json(gv, f->n));
	}
	free(gl);
	free(ge);
	free(gv);
	return r;
}

static json_t *run_case(json_t *c)
{
	json_t *out = json_object(), *opts = json_object_get(c, "options"), *kv;
	json_t *arrays = json_object_get(c, "arrays"), *sl = json_object_get(c, "seq_lens");
	struct loss_inputs_present pres;
	struct eng_error err = {0};
	struct loss_spec s;
	struct full f = {0};
	size_t i;
	int r;

	json_object_set(out, "id", json_object_get(c, "id"));
	f.num_seqs = (int32_t)json_array_size(sl);
	f.seq_lens = malloc(((size_t)f.num_seqs + 1) * sizeof(int32_t));
	f.seq_off = malloc(((size_t)f.num_seqs + 1) * sizeof(int64_t));
	if (!f.seq_lens || !f.seq_off)
		exit(3);
	for (int32_t k = 0; k < f.num_seqs; k++) {
		f.seq_lens[k] = (int32_t)json_integer_value(json_array_get(sl, (size_t)k));
		f.seq_off[k] = f.n;
		f.n += f.seq_lens[k];
	}
	f.log_probs = read_floats(arrays, "log_probs", f.n);
	f.entropy = read_floats(arrays, "entropy", f.n);
	f.values = read_floats(arrays, "values", f.n);
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		f.in[k] = read_floats(arrays, loss_inputs[k].name, f.n);

	r = loss_spec_init(&s, json_string_value(json_object_get(c, "name")), &err);
	json_array_foreach(opts, i, kv) {
		if (r)
			break;
		r = loss_spec_set(&s, json_string_value(json_array_get(kv, 0)),
				  json_string_value(json_array_get(kv, 1)), &err);
	}
	if (!r) {
		loss_inputs_present_init(&pres, f.n);
		for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
			if (f.in[k])
				pres.len[k] = f.n;
		if (f.entropy)
			pres.len[LOSS_IN_ENTROPY] = f.n;
		if (f.values)
			pres.len[LOSS_IN_VALUES] = f.n;
		r = loss_spec_validate(&s, &pres, &err);
	}
	if (!r) {
		if (json_object_get(c, "calls"))
			r = run_engine(&s, &f, c, out, &err);
		else
			r = run_compute(&s, &f, c, out, &err);
	}
	json_object_set_new(out, "rc", json_integer(r));
	json_object_set_new(out, "err", json_string(err.msg));
	free_full(&f);
	return out;
}

int main(int argc, char **argv)
{
	json_error_t jerr;
	json_t *cases, *c, *outs;
	size_t i;

	if (argc != 3) {
		fprintf(stderr, "usage: loss_driver CASES.json OUT.json\n");
		return 2;
	}
	cases = json_load_file(argv[1], 0, &jerr);
	if (!cases || !json_is_array(cases)) {
		fprintf(stderr, "loss_driver: %s: %s\n", argv[1], jerr.text);
		return 2;
	}
	outs = json_array();
	json_array_foreach(cases, i, c)
		json_array_append_new(outs, run_case(c));
	if (json_dump_file(outs, argv[2], JSON_COMPACT) != 0) {
		fprintf(stderr, "loss_driver: cannot write %s\n", argv[2]);
		return 2;
	}
	json_decref(outs);
	json_decref(cases);
	return 0;
}
