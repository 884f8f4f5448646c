/* cpu_param_bf16.c — the CPU device's bf16 copy of the parameter region the
 * engine declares (param_base, param_bytes): made for MATMUL_BF16 products
 * (rounded once per param_version), refreshed by AdamW in its own pass
 * (cpu_optim.c), and lent to consumers on this host as a sealed file
 * (device_ops.params_bf16_lend: ShareWeights without a copy).
 *
 * Memory: the copy lives in a memfd, mapped shared and writable while the
 * device writes it. Lending makes that file immutable for good: the
 * writable mapping is replaced, at the same address, by a private
 * read-only mapping of the same file (the same pages: nothing is copied,
 * and products keep reading the copy where they did), then the file is
 * sealed against writes, shrinking and growing (F_SEAL_WRITE, which the
 * kernel refuses while a writable shared mapping exists, so no writer is
 * left anywhere) and a duplicate descriptor goes to the caller. The next
 * writer of a lent copy (a refresh after the parameters changed) takes a
 * fresh memfd and lets the lent one go: its pages live on while a consumer
 * holds a descriptor or a mapping of it, and the kernel frees them after
 * the last one. A sealed file can never be written again, so there is
 * nothing to reuse and no release to wait for.
 *
 * Fresh memory costs: tmpfs allocates and clears each page at its first
 * touch and maps it (here 4 KiB pages: no shmem THP), which made the
 * optimizer step after a lend of the 0.5B shape 0.42-0.54 s longer
 * (tests/bench/bench_share.py, 2026-12-03). So a lend starts a thread
 * that prepares the next file (every page allocated and mapped writable,
 * MADV_POPULATE_WRITE: MAP_POPULATE would map them read-only and each
 * first write fault again) while the engine waits for its next call; the
 * next writer takes it, joining the thread if it is not done yet (then
 * +0.16-0.27 s). The thread runs under SCHED_IDLE: it takes no CPU that
 * anything else wants (the consumers, the daemon's replies).
 *
 * Every writer goes through p16_writable(); nothing writes cd->p16
 * directly. The rounding is cpu_round_bf16 (engines/io/round.h), the
 * stream's and the checkpoint writer's.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_device.h"

#define P16_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)
#define P16_CHUNK ((int64_t)1 << 16)

/* The copy exists and was made for the region the engine declares now
 * (its values may be of an older param_version). */
static bool p16_for_region(const struct cpu_device *cd, const struct device *dev)
{
	return cd->p16 && cd->p16_base == dev->param_base && cd->p16_bytes == dev->param_bytes;
}

static bool p16_current(const struct cpu_device *cd, const struct device *dev)
{
	return p16_for_region(cd, dev) && cd->p16_version == dev->param_version;
}

/* A new memfd of `bytes` mapped shared and writable (*ret_map); with
 * `populate` every page allocated and mapped writable now. -1 when out of
 * memory. */
static int file_new(size_t bytes, bool populate, void **ret_map)
{
	int fd = memfd_create("engined-params-bf16", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *map = MAP_FAILED;

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)bytes) == 0)
		map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	/* No access-recency tracking: unmapping it at a lend then skips
	 * marking each page accessed, which made that remap of a populated
	 * 1 GB copy take 0.095 s instead of 0.048 s (Zen 5, 6.18). The
	 * mapping is written whole; readahead does not apply to it. */
	if (map != MAP_FAILED)
		madvise(map, bytes, MADV_RANDOM);
	if (map != MAP_FAILED && populate && madvise(map, bytes, MADV_POPULATE_WRITE) < 0) {
		munmap(map, bytes);
		map = MAP_FAILED;
	}
	if (map == MAP_FAILED) {
		close(fd);
		return -1;
	}
	*ret_map = map;
	return fd;
}

static void *spare_main(void *arg)
{
	struct cpu_device *cd = arg;
	struct sched_param idle = { 0 };

	/* this work has until the next step */
	pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
	cd->spare_fd = file_new(cd->spare_bytes, true, &cd->spare_map);
	return NULL;
}

/* Start preparing a file of `bytes` for the next copy, unless one is on
 * its way or the host has not twice that memory available (then, as on a
 * failure to start, the writer makes its own when it needs it). */
static void spare_start(struct cpu_device *cd, size_t bytes)
{
	size_t avail = cd->base.ops->mem_free(&cd->base);

	if (cd->spare_started || (avail != SIZE_MAX && avail / 2 < bytes))
		return;
	cd->spare_bytes = bytes;
	cd->spare_fd = -1;
	cd->spare_started = pthread_create(&cd->spare_thread, NULL, spare_main, cd) == 0;
}

/* The prepared file and its mapping when there is one of `bytes` (the
 * caller's), else -1 (one of another size is let go). */
static int spare_take(struct cpu_device *cd, size_t bytes, void **ret_map)
{
	if (!cd->spare_started)
		return -1;
	pthread_join(cd->spare_thread, NULL);
	cd->spare_started = false;
	if (cd->spare_fd >= 0 && cd->spare_bytes != bytes) {
		munmap(cd->spare_map, cd->spare_bytes);
		close(cd->spare_fd);
		cd->spare_fd = -1;
	}
	*ret_map = cd->spare_map;
	return cd->spare_fd;
}

/* Let the copy go (a consumer's descriptor keeps a lent one alive). */
static void copy_drop(struct cpu_device *cd)
{
	if (cd->p16) {
		munmap(cd->p16, cd->p16_file_bytes);
		close(cd->p16_fd);
	}
	cd->p16 = NULL;
	cd->p16_fd = -1;
	cd->p16_file_bytes = 0;
	cd->p16_base = NULL;
	cd->p16_bytes = 0;
	cd->p16_lent = false;
}

void cpu_param_bf16_free(struct cpu_device *cd)
{
	void *map;

	(void)spare_take(cd, 0, &map);  /* joined and let go: no spare has size 0 */
	copy_drop(cd);
}

/* A copy of the declared region that may be written: the one there is
 * unless it is lent or was made for another region, else a fresh file (the
 * old copy let go). Its values are stale until the caller writes them and
 * sets p16_version. NULL when the region is empty or out of memory (the
 * old copy then stays as it was). */
static uint16_t *p16_writable(struct cpu_device *cd, const struct device *dev)
{
	size_t bytes = dev->param_bytes / sizeof(float) * sizeof(uint16_t);
	void *map;
	int fd;

	if (p16_for_region(cd, dev) && !cd->p16_lent)
		return cd->p16;
	if (!dev->param_base || !bytes)
		return NULL;
	fd = spare_take(cd, bytes, &map);
	if (fd < 0)
		fd = file_new(bytes, false, &map);
	if (fd < 0)
		return NULL;
	copy_drop(cd);
	cd->p16 = map;
	cd->p16_fd = fd;
	cd->p16_file_bytes = bytes;
	cd->p16_base = dev->param_base;
	cd->p16_bytes = dev->param_bytes;
	cd->p16_version = dev->param_version - 1;       /* stale */
	return cd->p16;
}

/* The copy holding param_version's values, rounded now when stale; NULL
 * when it cannot be made. On the calling thread's OpenMP team. */
static uint16_t *p16_make_current(struct device *dev)
{
	struct cpu_device *cd = cpu_dev(dev);
	const float *src = dev->param_base;
	int64_t n = (int64_t)(dev->param_bytes / sizeof(float));
	int64_t nchunks = (n + P16_CHUNK - 1) / P16_CHUNK;
	uint16_t *dst;

	if (p16_current(cd, dev))
		return cd->p16;
	dst = p16_writable(cd, dev);
	if (!dst)
		return NULL;
#pragma omp parallel for schedule(static)
	for (int64_t c = 0; c < nchunks; c++) {
		int64_t s = c * P16_CHUNK, len = n - s < P16_CHUNK ? n - s : P16_CHUNK;

		cpu_round_bf16(dst + s, src + s, len);
	}
	cd->p16_version = dev->param_version;
	return dst;
}

const uint16_t *cpu_param_bf16_of(struct device *dev, const float *X, int64_t rows,
				  int64_t cols, int64_t ld)
{
	const float *base = dev->param_base;
	size_t n = dev->param_bytes / sizeof(float);
	const uint16_t *p16;

	if (!base || ld != cols || X < base || X + rows * cols > base + n)
		return NULL;
	p16 = p16_make_current(dev);
	return p16 ? p16 + (X - base) : NULL;
}

uint16_t *cpu_param_bf16_whole(struct device *dev, const float *p, int64_t n)
{
	struct cpu_device *cd = cpu_dev(dev);

	if (!p16_for_region(cd, dev) || !p || p != dev->param_base || n < 0 ||
	    (size_t)n != dev->param_bytes / sizeof(float))
		return NULL;
	return p16_writable(cd, dev);
}

void cpu_param_bf16_refreshed(struct device *dev)
{
	cpu_dev(dev)->p16_version = dev->param_version;
}

const uint16_t *cpu_params_bf16(struct device *dev)
{
	struct cpu_device *cd = cpu_dev(dev);

	return dev->host_memory && p16_current(cd, dev) ? cd->p16 : NULL;
}

/* Make the copy immutable where it is (see the header). On a failure the
 * copy is dropped (after a failed remap the range may be unmapped). */
static int p16_seal(struct cpu_device *cd)
{
	int r;

	if (mmap(cd->p16, cd->p16_file_bytes, PROT_READ, MAP_PRIVATE | MAP_FIXED, cd->p16_fd,
		 0) == MAP_FAILED) {
		r = -errno;
		copy_drop(cd);
		return r;
	}
	if (fcntl(cd->p16_fd, F_ADD_SEALS, P16_SEALS) < 0) {
		r = -errno;
		copy_drop(cd);                  /* read-only now: never write it */
		return r;
	}
	cd->p16_lent = true;
	spare_start(cd, cd->p16_file_bytes);
	return 0;
}

int cpu_params_bf16_keep(struct device *dev)
{
	if (!dev->host_memory || !dev->param_base || !dev->param_bytes)
		return -ENOTSUP;
	cpu_enter(dev);
	return p16_make_current(dev) ? 0 : -ENOMEM;
}

int cpu_params_bf16_lend(struct device *dev, struct device_lent_file *ret)
{
	struct cpu_device *cd = cpu_dev(dev);
	int fd, r = cpu_params_bf16_keep(dev);

	if (r < 0)
		return r;
	if (!cd->p16_lent && (r = p16_seal(cd)) < 0)
		return r;
	fd = fcntl(cd->p16_fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ret->fd = fd;
	ret->bytes = cd->p16_file_bytes;
	ret->base = cd->p16;
	return 0;
}
