/* fileio.h — small POSIX I/O helpers shared by the safetensors and
 * checkpoint code: whole-buffer writes that survive EINTR and short writes. */
#ifndef ENGINED_IO_FILEIO_H
#define ENGINED_IO_FILEIO_H

#include <stddef.h>

/* Write all of buf to fd (in pieces of at most 1 GiB). 0 or -errno. */
int io_write_full(int fd, const void *buf, size_t len);

#endif
