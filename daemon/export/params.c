/* params.c — the parameters as the weight exports see them (see params.h). */
#include "params.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "io/safetensors.h"

/* Conversion step (fp32 elements: 4 KiB, a page) and how far ahead of it
 * one cache line of the source is prefetched: the hardware prefetcher
 * stops at each 4 KiB page, and one touch of the page two steps ahead
 * starts it there (a plain loop was measured at ~8 GB/s per core on the
 * first machines, prefetching ~12). One line, not the whole page: on the
 * AMD EPYC Zen 4 (2026-12-03, bf16 out of 2 GiB of fp32, one thread) a
 * prefetch of each of the page's 64 lines made the loop slower than no
 * prefetch at all (6.3-7.1 vs 8.2-10.2 GB/s of bf16 written), one line
 * 9.5-10.6. */
#define CONV_BLOCK 1024
#define PREFETCH_AHEAD 8192

int params_check_request(int dtype, char *const *names, size_t n_names,
			 struct eng_error *err)
{
	if (dtype != ENGINED__V1__DTYPE__DTYPE_UNSPECIFIED &&
	    dtype != ENGINED__V1__DTYPE__FLOAT32 &&
	    dtype != ENGINED__V1__DTYPE__BFLOAT16 &&
	    dtype != ENGINED__V1__DTYPE__FLOAT16)
		return eng_fail(err, -EINVAL,
				"dtype: %d not supported (FLOAT32, BFLOAT16, FLOAT16)", dtype);
	for (size_t i = 0; i < n_names; i++)
		if (!names[i][0])
			return eng_fail(err, -EINVAL, "names[%zu]: empty name", i);
	return 0;
}

static int find_param(struct engine *e, int64_t n, const char *name, int64_t *ret,
		      struct eng_error *err)
{
	struct engine_param_view v;

	for (int64_t i = 0; i < n; i++) {
		int r = engine_param_info(e, i, &v, err);

		if (r < 0)
			return r;
		if (strcmp(v.name, name) == 0) {
			*ret = i;
			return 0;
		}
	}
	return -ENOENT;
}

int params_collect(struct engine *e, int dtype, char *const *names, size_t n_names,
		   bool unique, struct param_set *s, struct eng_error *err)
{
	int64_t n = engine_num_params(e);
	int64_t count = n_names ? (int64_t)n_names : n;
	bool *seen = NULL;
	int r = 0;

	memset(s, 0, sizeof(*s));
	/* Each name at most once: more names than parameters cannot all be
	 * found, and the lookup's work stays bounded by the engine's size. */
	if (unique && count > n)
		return eng_fail(err, -EINVAL, "names: %lld names, the engine has %lld parameters",
				(long long)count, (long long)n);
	s->dtype = dtype == ENGINED__V1__DTYPE__DTYPE_UNSPECIFIED ?
		   ENGINED__V1__DTYPE__FLOAT32 : (Engined__V1__DType)dtype;
	s->edtype = s->dtype == ENGINED__V1__DTYPE__FLOAT32 ? ENGINE_DTYPE_F32 :
		    s->dtype == ENGINED__V1__DTYPE__BFLOAT16 ? ENGINE_DTYPE_BF16 :
		    ENGINE_DTYPE_F16;
	s->esz = engine_dtype_size(s->edtype);
	s->on_host = engine_num_params(e) > 0;
	s->t = calloc((size_t)(count ? count : 1), sizeof(*s->t));
	if (unique && n_names)
		seen = calloc((size_t)(n ? n : 1), sizeof(*seen));
	if (!s->t || (unique && n_names && !seen)) {
		r = eng_fail(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (int64_t i = 0; i < count; i++) {
		struct param_ref *t = &s->t[i];
		struct engine_param_view v;

		t->index = i;
		if (n_names) {
			r = find_param(e, n, names[i], &t->index, err);
			if (r == -ENOENT)
				r = eng_fail(err, -ENOENT, "names[%lld]: no parameter '%s'",
					     (long long)i, names[i]);
			if (r < 0)
				goto out;
			if (seen && seen[t->index]) {
				r = eng_fail(err, -EINVAL, "names[%lld]: '%s' given twice",
					     (long long)i, names[i]);
				goto out;
			}
			if (seen)
				seen[t->index] = true;
		}
		r = engine_param_info(e, t->index, &v, err);
		if (r < 0)
			goto out;
		t->name = v.name;
		t->ndim = v.ndim > 4 ? 4 : v.ndim;
		for (int k = 0; k < t->ndim; k++)
			t->shape[k] = v.shape[k];
		t->numel = v.numel;
		t->host = v.host_resident ? v.host_data : NULL;
		/* on_host: every tensor is the engine's own host memory (the
		 * CPU device), valid for the whole job and readable from other
		 * threads. Otherwise (device memory: CUDA, or the CPU device in
		 * discrete mode; an adapter's merged weights, computed one at a
		 * time) slices come through engine_param_copy on the engine
		 * thread. */
		s->on_host = s->on_host && t->host;
		t->data = s->edtype == ENGINE_DTYPE_F32 ? (const void *)t->host :
			   s->edtype == ENGINE_DTYPE_BF16 && t->host ? (const void *)v.host_bf16 :
			   NULL;
		if (!ck_mul_i64(v.numel, (int64_t)s->esz, &t->bytes) ||
		    !ck_add_i64(s->total_bytes, t->bytes, &s->total_bytes)) {
			r = eng_fail(err, -E2BIG, "%s: size overflows", v.name);
			goto out;
		}
	}
	s->n = count;
	s->in_place = true;
	for (int64_t i = 0; i < count; i++)
		s->in_place = s->in_place && s->t[i].data;
out:
	free(seen);
	if (r < 0)
		params_set_free(s);
	return r;
}

int params_use_bf16_copy(struct engine *e, struct param_set *s, bool lend,
			 struct engine_lent_file *ret_file, struct eng_error *why,
			 struct eng_error *err)
{
	struct engine_status st;
	int64_t all;
	int r;

	eng_error_clear(why);
	if (s->edtype != ENGINE_DTYPE_BF16 || !s->on_host)
		return 0;
	engine_status(e, &st);
	all = st.num_parameters;
	if (s->total_bytes / 2 < all - all / 2)
		return 0;
	r = lend ? engine_lend_params_bf16(e, ret_file, why) : engine_keep_params_bf16(e, why);
	if (r == -ENOTSUP)
		return 0;
	if (r < 0) {
		*err = *why;
		eng_error_clear(why);
		return r;
	}
	for (int64_t i = 0; i < s->n; i++) {
		struct engine_param_view v;

		r = engine_param_info(e, s->t[i].index, &v, err);
		if (r == 0 && !v.host_bf16)
			r = eng_fail(err, -EIO, "%s: no bf16 copy after the engine made it",
				     v.name);
		if (r < 0) {
			if (lend)
				close(ret_file->fd);
			return r;
		}
		s->t[i].data = v.host_bf16;
	}
	s->in_place = true;
	return 1;
}

int params_export_agree(struct engine *base, const char *adapter, int adapter_view, int rc,
			const char *what, struct eng_error *err)
{
	struct engine_status st;

	if (adapter[0] && adapter_view == ENGINED__V1__ADAPTER_VIEW__ADAPTER_VIEW_ADAPTER)
		return rc;
	engine_status(base, &st);
	if (st.dist_world_size > 1 && st.dist_zero_stage == 3)
		return engine_group_agree(base, rc, what, err);
	return rc;
}

int params_take_part(struct engine *e, const struct param_set *s, struct eng_error *err)
{
	for (int64_t i = 0; i < s->n; i++) {
		float one;
		int r = s->t[i].numel ? engine_param_copy(e, s->t[i].index, ENGINE_DTYPE_F32, 0, 1,
							  &one, err) : 0;

		if (r < 0)
			return r;
	}
	return 0;
}

void params_set_free(struct param_set *s)
{
	free(s->t);
	s->t = NULL;
	s->n = 0;
}

void params_convert(enum engine_dtype dt, const float *src, uint16_t *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i += CONV_BLOCK) {
		int64_t m = n - i < CONV_BLOCK ? n - i : CONV_BLOCK;
		/* An address, not a pointer: it may lie past the tensor (a
		 * prefetch never faults). */
		uintptr_t ahead = (uintptr_t)(src + i) + PREFETCH_AHEAD;

		__builtin_prefetch((const void *)ahead, 0, 2);
		if (dt == ENGINE_DTYPE_BF16)
			f32_to_bf16_n(src + i, dst + i, (size_t)m);
		else
			f32_to_f16_n(src + i, dst + i, (size_t)m);
	}
}

int params_read(struct engine *e, const struct param_set *s, const struct param_ref *t,
		int64_t start, int64_t count, void *dst, struct eng_error *err)
{
	if (count <= 0)
		return 0;
	if (start < 0 || start > t->numel - count)
		return eng_fail(err, -EINVAL, "%s: elements [%lld, +%lld) outside its %lld",
				t->name, (long long)start, (long long)count, (long long)t->numel);
	if (t->data) {
		memcpy(dst, (const uint8_t *)t->data + start * (int64_t)s->esz,
		       (size_t)count * s->esz);
		return 0;
	}
	if (t->host) {
		params_convert(s->edtype, t->host + start, dst, count);
		return 0;
	}
	return engine_param_copy(e, t->index, s->edtype, start, count, dst, err);
}
