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
 * Every writer goes through p16_writable(); nothing writes cd->p16
 * directly. The rounding is cpu_round_bf16 (engines/io/round.h), the
 * stream's and the checkpoint writer's.
 */
#include <errno.h>
#include <fcntl.h>
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

void cpu_param_bf16_free(struct cpu_device *cd)
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
	fd = memfd_create("engined-params-bf16", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return NULL;
	map = ftruncate(fd, (off_t)bytes) == 0 ?
	      mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (map == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	cpu_param_bf16_free(cd);
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
		cpu_param_bf16_free(cd);
		return r;
	}
	if (fcntl(cd->p16_fd, F_ADD_SEALS, P16_SEALS) < 0) {
		r = -errno;
		cpu_param_bf16_free(cd);        /* read-only now: never write it */
		return r;
	}
	cd->p16_lent = true;
	return 0;
}

int cpu_params_bf16_lend(struct device *dev, struct device_lent_file *ret)
{
	struct cpu_device *cd = cpu_dev(dev);
	int fd, r;

	if (!dev->host_memory || !dev->param_base || !dev->param_bytes)
		return -ENOTSUP;
	cpu_enter(dev);
	if (!p16_make_current(dev))
		return -ENOMEM;
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
