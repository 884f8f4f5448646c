/* engine_host.c — what the engine library tells its host program about
 * this machine (engine.h): the devices built in, host memory, the CPU
 * budget; so that the daemon asks the library and not its devices. */
#include "engine.h"

#include <stdint.h>

#include "device/cpu_budget.h"
#include "device/device.h"

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
