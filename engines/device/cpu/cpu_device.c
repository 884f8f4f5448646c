/* cpu_device.c — the CPU device: open/close, memory, copies, scratch.
 *
 * Device memory is host memory from aligned_alloc (64-byte aligned, the
 * width of an AVX-512 register and of a cache line). Each allocation carries
 * a 64-byte header holding its size so that free() can keep mem_in_use
 * exact. mem_in_use counts what alloc() handed out and free() has not taken
 * back; the device's own scratch (bf16 copies for gemm, attention tiles) is
 * not counted.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "device/cpu_budget.h"
#include "cpu_device.h"

/* The header in front of every allocation; CPU_ALIGN bytes keep the user
 * pointer aligned. */
struct cpu_block {
	size_t bytes;
};

void cpu_enter(struct device *dev)
{
	int threads = cpu_dev(dev)->threads;

	if (omp_get_max_threads() != threads)
		omp_set_num_threads(threads);
}

void *cpu_scratch(struct device *dev, enum cpu_scratch_slot slot, size_t bytes)
{
	struct cpu_scratch *s = &cpu_dev(dev)->scratch[slot];
	size_t rounded;

	if (s->ptr && s->bytes >= bytes)
		return s->ptr;
	free(s->ptr);
	s->ptr = NULL;
	s->bytes = 0;
	/* Grow by at least 1/4 so that slowly increasing sizes do not
	 * reallocate on every call. */
	rounded = bytes + bytes / 4;
	rounded = (rounded + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
	if (rounded < CPU_ALIGN)
		rounded = CPU_ALIGN;
	s->ptr = aligned_alloc(CPU_ALIGN, rounded);
	if (!s->ptr)
		return NULL;
	s->bytes = rounded;
	return s->ptr;
}

static void cpu_close(struct device *dev)
{
	struct cpu_device *cd;
	int i;

	if (!dev)
		return;
	cd = cpu_dev(dev);
	cpu_gemm_fini(cd);
	for (i = 0; i < CPU_SCRATCH_COUNT; i++)
		free(cd->scratch[i].ptr);
	cpu_param_bf16_free(cd);
	free(cd);
}

static int cpu_open(struct device **ret, int threads, enum matmul_precision prec)
{
	struct cpu_device *cd;
	int r;

	if (prec != MATMUL_FP32 && prec != MATMUL_BF16)
		return -EINVAL;
	cd = calloc(1, sizeof(*cd));
	if (!cd)
		return -ENOMEM;
	cd->base.ops = &cpu_device_ops;
	cd->base.k = &cpu_kernel_table;
	cd->base.prec = prec;
	if (getenv("ENGINED_CPU_FAIL_AT_ALLOC"))
		cd->fail_at_alloc = atol(getenv("ENGINED_CPU_FAIL_AT_ALLOC"));
	cd->base.host_memory = !getenv("ENGINED_CPU_DISCRETE") ||
			       strcmp(getenv("ENGINED_CPU_DISCRETE"), "1") != 0;
	if (threads <= 0) {
		struct cpu_budget b;

		cpu_budget_self(&b);
		threads = b.threads;
	}
	omp_set_num_threads(threads);
	cd->threads = threads;
	atomic_init(&cd->in_use, 0);
	atomic_init(&cd->allocs, 0);
	r = cpu_gemm_init(cd);
	if (r < 0) {
		cpu_close(&cd->base);
		return r;
	}
	*ret = &cd->base;
	return 0;
}

static void *cpu_alloc(struct device *dev, size_t bytes)
{
	struct cpu_device *cd = cpu_dev(dev);
	struct cpu_block *b;
	size_t total;

	if (dev->failed)
		return NULL;
	if (cd->fail_at_alloc > 0 && atomic_fetch_add(&cd->allocs, 1) + 1 >= cd->fail_at_alloc) {
		dev->failed = "injected device failure (ENGINED_CPU_FAIL_AT_ALLOC)";
		return NULL;
	}
	if (bytes > SIZE_MAX - 2 * CPU_ALIGN || device_alloc_fault())
		return NULL;
	total = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN + CPU_ALIGN;
	b = aligned_alloc(CPU_ALIGN, total);
	if (!b)
		return NULL;
	b->bytes = bytes;
	atomic_fetch_add(&cd->in_use, bytes);
	return (char *)b + CPU_ALIGN;
}

static void cpu_free(struct device *dev, void *ptr)
{
	struct cpu_block *b;

	if (!ptr)
		return;
	b = (struct cpu_block *)((char *)ptr - CPU_ALIGN);
	atomic_fetch_sub(&cpu_dev(dev)->in_use, b->bytes);
	free(b);
}

static int cpu_memset0(struct device *dev, void *ptr, size_t bytes)
{
	if (bytes)
		memset(ptr, 0, bytes);
	return 0;
}

/* All three directions are host memcpy; memmove keeps overlapping d2d
 * copies defined. */
static int cpu_copy(struct device *dev, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

/* Kernels run synchronously: nothing is ever queued. */
static int cpu_sync(struct device *dev)
{
	return 0;
}

static size_t cpu_mem_in_use(struct device *dev)
{
	return atomic_load(&cpu_dev(dev)->in_use);
}

/* A number from a one-line file ("max" or missing: SIZE_MAX). */
static size_t read_size_file(const char *path)
{
	FILE *f = fopen(path, "r");
	unsigned long long v;
	size_t r = SIZE_MAX;

	if (!f)
		return SIZE_MAX;
	if (fscanf(f, "%llu", &v) == 1)
		r = (size_t)v;
	fclose(f);
	return r;
}

/* MemAvailable, and no more than the cgroup (v2) allows beyond what it
 * already charges. */
static size_t cpu_mem_free(struct device *dev)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	unsigned long long kib;
	size_t avail = SIZE_MAX, max, cur;

	(void)dev;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
			avail = (size_t)kib * 1024;
			break;
		}
	if (f)
		fclose(f);
	max = read_size_file("/sys/fs/cgroup/memory.max");
	cur = read_size_file("/sys/fs/cgroup/memory.current");
	if (max != SIZE_MAX && cur != SIZE_MAX)
		avail = avail < (max > cur ? max - cur : 0) ? avail : (max > cur ? max - cur : 0);
	return avail;
}

/* Host memory is not counted in mem_in_use: it is what "offloaded" means. */
static void *cpu_host_alloc(struct device *dev, size_t bytes)
{
	if (device_alloc_fault())
		return NULL;
	return aligned_alloc(CPU_ALIGN, (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN + CPU_ALIGN);
}

static void cpu_host_free(struct device *dev, void *ptr)
{
	free(ptr);
}

const struct device_ops cpu_device_ops = {
	.name = "cpu",
	.open = cpu_open,
	.close = cpu_close,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.memset0 = cpu_memset0,
	.copy_h2d = cpu_copy,
	.copy_d2h = cpu_copy,
	.copy_d2d = cpu_copy,
	.sync = cpu_sync,
	.mem_in_use = cpu_mem_in_use,
	.mem_free = cpu_mem_free,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
	.params_bf16 = cpu_params_bf16,
	.params_bf16_keep = cpu_params_bf16_keep,
	.params_bf16_lend = cpu_params_bf16_lend,
};
