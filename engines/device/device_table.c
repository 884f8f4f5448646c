/* device_table.c — the devices built into this binary, found by name.
 *
 * A static table, not #ifdefs: the CPU device is always built. The CUDA
 * entry, `&cuda_device_ops` (declared in device.h), is defined either by
 * engines/device/cuda/ (when meson finds nvcc) or by engines/device/
 * cuda_stub.c, which meson picks otherwise and whose `name` is NULL;
 * entries whose name is NULL are skipped, so callers never see a device
 * that was not built.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "device/device.h"

static const struct device_ops *const devices[] = {
	&cpu_device_ops,
	&cuda_device_ops,
};

#define N_DEVICES (sizeof(devices) / sizeof(devices[0]))

/* Long enough for every name in the table and the separators. */
static char names[128];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

const struct device_ops *device_find(const char *name)
{
	size_t i;

	if (!name)
		return NULL;
	for (i = 0; i < N_DEVICES; i++) {
		if (devices[i]->name && strcmp(devices[i]->name, name) == 0)
			return devices[i];
	}
	return NULL;
}

static void build_names(void)
{
	size_t i, len = 0;

	for (i = 0; i < N_DEVICES; i++) {
		const char *n = devices[i]->name;
		size_t nl;

		if (!n)
			continue;
		nl = strlen(n);
		if (len + nl + 2 > sizeof(names))
			break;
		if (len)
			names[len++] = ',';
		memcpy(names + len, n, nl);
		len += nl;
	}
	names[len] = '\0';
}

const char *device_names(void)
{
	(void)pthread_once(&names_once, build_names);
	return names;
}

/* < 0: no fault injection; else the number of allocations still allowed. */
static atomic_long alloc_countdown = -1;

void device_fail_allocs_after(long n)
{
	atomic_store(&alloc_countdown, n);
}

bool device_alloc_fault(void)
{
	long c = atomic_load(&alloc_countdown);

	while (c > 0 && !atomic_compare_exchange_weak(&alloc_countdown, &c, c - 1))
		;
	return c == 0;
}
