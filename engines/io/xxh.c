/* xxh.c — XXH64 checksum of a whole file (safetensors.h), used to verify
 * checkpoint files. Streams the file with large reads so that a multi-GB
 * checkpoint is hashed at disk speed with a bounded buffer.
 */
#include "safetensors.h"
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define XXH_READ_CHUNK (8u << 20)

int file_xxh64(const char *path, uint64_t *ret, struct eng_error *err)
{
	int fd = io_open_file(path, O_RDONLY, 0), r;

	if (fd < 0)
		return eng_fail(err, eng_errno_code(-fd), "%s: cannot open: %s", path,
				eng_errno_text(-fd));
	r = fd_xxh64(fd, path, ret, err);
	close(fd);
	return r;
}

int fd_xxh64(int fd, const char *path, uint64_t *ret, struct eng_error *err)
{
	return fd_xxh64_progress(fd, path, NULL, NULL, ret, err);
}

int fd_xxh64_progress(int fd, const char *path, void (*fn)(void *ctx, uint64_t bytes),
		      void *ctx, uint64_t *ret, struct eng_error *err)
{
	XXH64_state_t *st = NULL;
	char *buf = NULL;
	off_t off = 0;
	int r = 0;

	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	buf = malloc(XXH_READ_CHUNK);
	st = XXH64_createState();
	if (!buf || !st) {
		r = eng_fail(err, -ENOMEM, "%s: no memory for the checksum buffer", path);
		goto out;
	}
	XXH64_reset(st, 0);
	for (;;) {
		ssize_t n = pread(fd, buf, XXH_READ_CHUNK, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = eng_fail(err, eng_errno_code(errno), "%s: read: %s", path,
				     strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		XXH64_update(st, buf, (size_t)n);
		off += n;
		if (fn)
			fn(ctx, (uint64_t)off);
	}
	*ret = XXH64_digest(st);
out:
	XXH64_freeState(st);
	free(buf);
	return r;
}
