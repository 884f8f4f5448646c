/* fileio.c — see fileio.h. */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IO_MAX ((size_t)1 << 30)
/* First buffer for a source of unknown size (pipe, device). */
#define IO_READ_START 4096

int io_write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		size_t chunk = len < IO_MAX ? len : IO_MAX;
		ssize_t n = write(fd, p, chunk);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void drop(char *buf, size_t len)
{
	if (buf) {
		explicit_bzero(buf, len);
		free(buf);
	}
}

int io_read_file(const char *path, size_t max_bytes, char **ret, size_t *ret_len)
{
	struct stat st;
	char *buf = NULL;
	size_t len = 0, cap, limit;
	int fd, r = 0;

	/* The buffer never grows past max_bytes + 1 data bytes (one more than
	 * allowed tells an over-long file) plus the NUL. */
	if (max_bytes > SIZE_MAX - 2)
		max_bytes = SIZE_MAX - 2;
	limit = max_bytes + 2;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		if ((uint64_t)st.st_size > (uint64_t)max_bytes) {
			close(fd);
			return -EFBIG;
		}
		/* Room for the whole file, one byte to see its end and the
		 * NUL: one allocation unless the file grows meanwhile. */
		cap = (size_t)st.st_size + 2;
	} else {
		cap = limit < IO_READ_START ? limit : IO_READ_START;
	}
	buf = malloc(cap);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (;;) {
		ssize_t n;

		if (len + 1 >= cap) {
			/* Full: grow (copy, wipe, free; not realloc, which
			 * would leave the old bytes behind). */
			size_t ncap = cap <= limit / 2 ? cap * 2 : limit;
			char *nb;

			if (ncap <= cap) {        /* cannot happen: len <= max_bytes */
				r = -EFBIG;
				break;
			}
			nb = malloc(ncap);
			if (!nb) {
				r = -ENOMEM;
				break;
			}
			memcpy(nb, buf, len);
			drop(buf, len);
			buf = nb;
			cap = ncap;
		}
		n = read(fd, buf + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > max_bytes) {
			r = -EFBIG;
			break;
		}
	}
	close(fd);
	if (r) {
		drop(buf, len);
		return r;
	}
	buf[len] = '\0';
	*ret = buf;
	if (ret_len)
		*ret_len = len;
	return 0;
}
