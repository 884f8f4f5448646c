/* cuda_kernels.c — the CUDA device's kernel table: cuda_<name> for every
 * entry of device.h's DEVICE_KERNELS (the contract of each there, the
 * implementations in cuda_*.cu and cuda_gemm.c). */
#include "cuda_device.h"

const struct kernel_table cuda_kernel_table = {
#define CUDA_KERNEL_ENTRY(name, params) .name = cuda_##name,
	DEVICE_KERNELS(CUDA_KERNEL_ENTRY)
#undef CUDA_KERNEL_ENTRY
};
