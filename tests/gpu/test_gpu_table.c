/* test_gpu_table.c — the CUDA device is complete: every entry of its
 * kernel table and device ops is set. Runs without a GPU (it only reads
 * the tables), so CI catches a kernel added to device.h but not to the
 * CUDA device (designated initializers leave it NULL silently). */
#include "gpu_test.h"

#include "device/cuda/cuda_device.h"

int main(void)
{
	const struct device_ops *ops = device_find("cuda");
	/* the tables are plain arrays of function pointers after the name */
	void (*const *k)(void) = (void (*const *)(void))&cuda_kernel_table;
	size_t nk = sizeof(cuda_kernel_table) / sizeof(*k);

	gt_check(ops == &cuda_device_ops, "device_find(\"cuda\") does not find the CUDA device");
	for (size_t i = 0; i < nk; i++)
		gt_check(k[i] != NULL, "cuda_kernel_table entry %zu of %zu is NULL", i, nk);
	gt_check(ops && ops->open && ops->close && ops->alloc && ops->free && ops->memset0 &&
		 ops->copy_h2d && ops->copy_d2h && ops->copy_d2d && ops->sync && ops->mem_in_use &&
		 ops->host_alloc && ops->host_free, "a CUDA device op is NULL");
	gt_check(!strcmp(cuda_device_ops.name, "cuda"), "name");
	return gt_finish("test_gpu_table");
}
