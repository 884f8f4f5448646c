/* fileio.c — see fileio.h. */
#include "fileio.h"

#include <errno.h>
#include <unistd.h>

#define IO_MAX ((size_t)1 << 30)

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
