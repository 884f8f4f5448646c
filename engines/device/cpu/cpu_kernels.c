/* cpu_kernels.c — the CPU device's kernel table: cpu_<name> for every
 * entry of device.h's DEVICE_KERNELS (the contract of each there, the
 * implementations in cpu_*.c). */
#include "cpu_device.h"

const struct kernel_table cpu_kernel_table = {
#define CPU_KERNEL_ENTRY(name, params) .name = cpu_##name,
	DEVICE_KERNELS(CPU_KERNEL_ENTRY)
#undef CPU_KERNEL_ENTRY
};
