/* adapters.c — the table of live LoRA adapters (see adapters.h). A short
 * array in creation order: [lora] max_adapters is at most a few thousand
 * and a call looks one name up. */
#include "adapters.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"

int adapters_init(struct adapters *t, int max, int64_t max_bytes)
{
	memset(t, 0, sizeof(*t));
	if (max > 0) {
		t->v = calloc((size_t)max, sizeof(*t->v));
		if (!t->v)
			return -ENOMEM;
	}
	t->max = max;
	t->max_bytes = max_bytes;
	return 0;
}

void adapters_fini(struct adapters *t)
{
	adapters_clear(t);
	free(t->v);
	t->v = NULL;
	t->max = 0;
}

static int find(const struct adapters *t, const char *name)
{
	for (int i = 0; i < t->n; i++)
		if (!strcmp(t->v[i].name, name))
			return i;
	return -1;
}

struct engine *adapters_find(const struct adapters *t, const char *name)
{
	int i = find(t, name);

	return i < 0 ? NULL : t->v[i].e;
}

int adapters_may_add(const struct adapters *t, const char *name, struct eng_error *err)
{
	if (find(t, name) >= 0)
		return eng_fail(err, -EEXIST, "name: an adapter named '%s' already exists", name);
	if (t->n >= t->max)
		return eng_fail(err, -E2BIG,
				"[lora] max_adapters: adapter '%s' would be number %d; %d are live "
				"and max_adapters = %d (DeleteAdapter one first)",
				name, t->n + 1, t->n, t->max);
	return 0;
}

int adapters_add(struct adapters *t, const char *name, struct engine *e,
		 struct eng_error *err)
{
	struct engine_status st;
	struct adapter *a;
	int64_t bytes, total;
	int r = adapters_may_add(t, name, err);

	if (r < 0)
		return r;
	if (strlen(name) >= sizeof(a->name))
		return eng_fail(err, -EINVAL, "name: longer than %d characters",
				ENGINE_ADAPTER_NAME_MAX);
	engine_status(e, &st);
	if (!ck_mul_i64(st.num_parameters, ADAPTER_BYTES_PER_PARAM, &bytes))
		bytes = INT64_MAX;
	if (!ck_add_i64(t->bytes, bytes, &total) || total > t->max_bytes)
		return eng_fail(err, -E2BIG,
				"[lora] max_adapter_bytes: adapter '%s' would need %lld bytes "
				"(%lld parameters x %d: weights, gradients, two AdamW moments); "
				"%lld are held by %d live adapters and max_adapter_bytes = %lld",
				name, (long long)bytes, (long long)st.num_parameters,
				ADAPTER_BYTES_PER_PARAM, (long long)t->bytes, t->n,
				(long long)t->max_bytes);
	a = &t->v[t->n++];
	snprintf(a->name, sizeof(a->name), "%s", name);
	a->e = e;
	a->bytes = bytes;
	t->bytes = total;
	return 0;
}

int adapters_delete(struct adapters *t, const char *name, const char *field,
		    struct eng_error *err)
{
	int i = find(t, name);

	if (i < 0)
		return eng_fail(err, -ENOENT, "%s: no adapter named '%s'", field, name);
	engine_destroy(t->v[i].e);
	t->bytes -= t->v[i].bytes;
	memmove(&t->v[i], &t->v[i + 1], (size_t)(t->n - i - 1) * sizeof(t->v[0]));
	t->n--;
	return 0;
}

void adapters_clear(struct adapters *t)
{
	while (t->n > 0) {
		t->n--;
		engine_destroy(t->v[t->n].e);
		t->v[t->n].e = NULL;
	}
	t->bytes = 0;
}

int adapters_status(const struct adapters *t, struct adapter_status *ret)
{
	for (int i = 0; i < t->n; i++) {
		snprintf(ret[i].name, sizeof(ret[i].name), "%s", t->v[i].name);
		engine_status(t->v[i].e, &ret[i].st);
	}
	return t->n;
}
