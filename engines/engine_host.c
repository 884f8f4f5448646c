/* engine_host.c — what the engine library tells its host program about
 * this machine (engine.h): the devices built in, host memory, the CPU
 * budget, and new data-parallel groups; so that the daemon asks the
 * library and not its devices or collective backends. */
#include "engine.h"

#include <stdint.h>

#include "device/cpu_budget.h"
#include "device/device.h"
#include "dist/dist.h"

bool engine_device_built(const char *name)
{
	return device_find(name) != NULL;
}

const char *engine_device_names(void)
{
	return device_names();
}

size_t engine_host_mem_free(void)
{
	const struct device_ops *cpu = device_find("cpu");

	return cpu && cpu->mem_free ? cpu->mem_free(NULL) : SIZE_MAX;
}

int engine_cpu_budget(char *desc, size_t len)
{
	struct cpu_budget b;

	cpu_budget_self(&b);
	if (desc && len)
		cpu_budget_describe(&b, desc, len);
	return b.threads;
}

int engine_group_check(const char *device, int world_size, struct eng_error *err)
{
	int rc = dist_world_size_check("world_size", world_size, 2, err);

	return rc ? rc : dist_backend_check("device", device, NULL, err);
}

int engine_group_create(const char *device, const struct dist_config *cfg,
			struct dist_group_id *ret_id, const char **ret_backend,
			struct eng_error *err)
{
	const struct dist_ops *ops;
	int rc = dist_world_size_check("world_size", cfg->world_size, 2, err);

	if (rc == 0)
		rc = dist_backend_check("device", device, &ops, err);
	if (rc == 0)
		rc = ops->create_id(cfg, ret_id, err);
	if (rc == 0)
		*ret_backend = ops->name;
	return rc;
}
