/* registry.c — engines by (model_type, backend, device).
 *
 * A static table: each engine implementation exports its ops and is listed
 * here once per device it supports. Devices that were not built register
 * nothing (their ops symbols come from a stub that is absent from the table
 * — see engines/device/device_table.c), so lookups of their keys fail with
 * the list of what is registered. */
#include "engine.h"
#include "native/native_engine.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static const struct engine_ops *const registry[] = {
	&native_lm_cpu_ops,
	&native_value_cpu_ops,
};

#define REGISTRY_LEN (sizeof(registry) / sizeof(registry[0]))

static char keys[512];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void build_keys(void)
{
	for (size_t i = 0; i < REGISTRY_LEN; i++) {
		size_t len = strlen(keys);

		snprintf(keys + len, sizeof(keys) - len, "%s(%s, %s, %s)", i ? ", " : "",
			 registry[i]->model_type, registry[i]->backend, registry[i]->device);
	}
}

const char *engine_registry_keys(void)
{
	(void)pthread_once(&keys_once, build_keys);
	return keys;
}

int engine_registry_lookup(const char *model_type, const char *backend,
			   const char *device, const struct engine_ops **ret,
			   struct eng_error *err)
{
	for (size_t i = 0; i < REGISTRY_LEN; i++) {
		const struct engine_ops *o = registry[i];

		if (!strcmp(o->model_type, model_type) && !strcmp(o->backend, backend) &&
		    !strcmp(o->device, device)) {
			*ret = o;
			return 0;
		}
	}
	return eng_fail(err, -ENODEV,
			"engine (%s, %s, %s) is not registered; registered: %s",
			model_type, backend, device, engine_registry_keys());
}
