/* xxh.c — XXH64 checksum of a whole file (safetensors.h), used to verify
 * checkpoint files. Streams the file with large reads so that a multi-GB
 * checkpoint is hashed at disk speed with a bounded buffer.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define XXH_READ_CHUNK (8u << 20)

int file_xxh64(const char *path, uint64_t *ret, struct eng_error *err)
{
	XXH64_state_t *st = NULL;
	char *buf = NULL;
	int fd, r = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;

		return eng_fail(err, e == ENOENT ? -ENOENT : -EIO, "%s: cannot open: %s",
				path, strerror(e));
	}
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	buf = malloc(XXH_READ_CHUNK);
	st = XXH64_createState();
	if (!buf || !st) {
		r = eng_fail(err, -ENOMEM, "%s: no memory for the checksum buffer", path);
		goto out;
	}
	XXH64_reset(st, 0);
	for (;;) {
		ssize_t n = read(fd, buf, XXH_READ_CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = eng_fail(err, -EIO, "%s: read: %s", path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		XXH64_update(st, buf, (size_t)n);
	}
	*ret = XXH64_digest(st);
out:
	XXH64_freeState(st);
	free(buf);
	close(fd);
	return r;
}
