/* cuda_stub.c — the CUDA device when it is not built.
 *
 * meson compiles this file instead of engines/device/cuda/ when nvcc or the
 * CUDA toolkit is missing (or -Dcuda=disabled). A NULL name makes
 * device_find() skip the entry, so the registry lists no CUDA engine and
 * lookups name only the devices that exist; nothing is #ifdef'd in callers.
 */
#include "device/device.h"

const struct device_ops cuda_device_ops = {
	.name = NULL,
};
