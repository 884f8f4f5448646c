/* fileio.h — small POSIX I/O helpers shared by the safetensors and
 * checkpoint code, the daemon and the client: the one open of a file inside
 * a directory that never follows a symlink (io_openat, io_open_file),
 * whole-buffer writes that survive EINTR and short writes, and reading a
 * whole (small) file.
 *
 * The rule for files inside checkpoint and model directories: the
 * directory a caller names is trusted as named (the daemon hands the
 * engine a directory it resolved beneath its root, "/proc/self/fd/N", and
 * a directory may be reached through symlinks that stay inside the root);
 * everything the engine opens below it goes through io_openat, so a
 * symlink there (to a file outside the root, or anywhere) is refused with
 * -ELOOP, which eng_errno_code turns into -EPERM (PERMISSION_DENIED). */
#ifndef ENGINED_IO_FILEIO_H
#define ENGINED_IO_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Open `rel` beneath the directory dirfd (AT_FDCWD: the current
 * directory) with open(2)'s flags and mode, following no symlink in any
 * component of rel: openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS), or on kernels without openat2 (< 5.6) a walk of
 * one O_NOFOLLOW component at a time. O_CLOEXEC is always added; the open
 * itself never blocks on a FIFO (O_NONBLOCK during the open only). Returns
 * the descriptor, or:
 *   -ELOOP   a component of rel is a symlink (also with O_PATH)
 *   -EXDEV   rel is absolute or has a ".." component
 *   -errno   of the open (-ENOENT, -EACCES, -ENOSPC, ...) */
int io_openat(int dirfd, const char *rel, int flags, mode_t mode);

/* io_openat of path's last component inside path's directory, which is
 * opened as named (it may be or pass through symlinks: the caller named
 * it): the file itself is never a symlink. A path without '/' is relative
 * to the current directory. Same returns as io_openat. */
int io_open_file(const char *path, int flags, mode_t mode);

/* Tests: take the openat2-less walk even where openat2 exists. */
void io_openat_force_walk(bool on);

/* Write all of buf to fd (in pieces of at most 1 GiB). 0 or -errno. */
int io_write_full(int fd, const void *buf, size_t len);

/* Read the file at path (opened as named, following symlinks: files an
 * operator or a user names, such as TLS keys or token files) to its end
 * into a malloc'ed buffer, NUL-terminated (*ret; the length without the
 * NUL in *ret_len, which may be NULL). Reads
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

/* io_read_file of `rel` opened with io_openat(dirfd, rel, O_RDONLY): a
 * file inside a checkpoint or model directory. Also -ELOOP, -EXDEV. */
int io_read_file_at(int dirfd, const char *rel, size_t max_bytes, char **ret,
		    size_t *ret_len);

#endif
