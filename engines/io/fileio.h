/* fileio.h — small POSIX I/O helpers shared by the safetensors and
 * checkpoint code, the daemon and the client: whole-buffer writes that
 * survive EINTR and short writes, and reading a whole (small) file. */
#ifndef ENGINED_IO_FILEIO_H
#define ENGINED_IO_FILEIO_H

#include <stddef.h>

/* Write all of buf to fd (in pieces of at most 1 GiB). 0 or -errno. */
int io_write_full(int fd, const void *buf, size_t len);

/* Read the file at path to its end into a malloc'ed buffer, NUL-terminated
 * (*ret; the length without the NUL in *ret_len, which may be NULL). Reads
 * pipes and devices as well as regular files. At most max_bytes bytes: a
 * regular file that is larger is refused without reading it, any other
 * source after reading max_bytes + 1 bytes, so a huge or endless file
 * (/dev/zero) cannot exhaust memory. Buffers dropped on the way or on
 * failure are wiped first (the file may be a key). Returns 0, or:
 *   -EFBIG   more than max_bytes bytes
 *   -ENOMEM  no memory
 *   -EISDIR  path is a directory
 *   -errno   of open(2) (-ENOENT, -EACCES, ...) or read(2) (-EIO)
 * *ret and *ret_len are set only on success. */
int io_read_file(const char *path, size_t max_bytes, char **ret, size_t *ret_len);

#endif
