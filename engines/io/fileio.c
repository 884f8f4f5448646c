/* fileio.c — see fileio.h. */
#include "io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/openat2.h>

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

/* --- opening without symlinks ------------------------------------------ */

static bool have_openat2 = true;   /* cleared on ENOSYS (kernels < 5.6) */
static bool force_walk;

void io_openat_force_walk(bool on)
{
	force_walk = on;
}

/* rel's components must not be ".."; rel must not be absolute. */
static bool escapes(const char *rel)
{
	const char *p = rel;

	if (rel[0] == '/')
		return true;
	while (*p) {
		const char *q = strchr(p, '/');
		size_t n = q ? (size_t)(q - p) : strlen(p);

		if (n == 2 && p[0] == '.' && p[1] == '.')
			return true;
		p += n;
		while (*p == '/')
			p++;
	}
	return false;
}

static bool is_symlink_at(int dirfd, const char *name)
{
	struct stat st;

	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

/* The walk for kernels without openat2: every directory component opened
 * with O_NOFOLLOW, then the last one. Returns a descriptor or -errno. */
static int walk_open(int dirfd, const char *rel, int flags, mode_t mode)
{
	char buf[PATH_MAX], *comp, *next, *save = NULL;
	int cur = dirfd, fd, e;

	if (strlen(rel) >= sizeof(buf))
		return -ENAMETOOLONG;
	strcpy(buf, rel);
	comp = strtok_r(buf, "/", &save);
	if (!comp)
		comp = (char *)".";
	for (;;) {
		next = strtok_r(NULL, "/", &save);
		if (!next)
			break;
		fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		e = errno;
		if (fd < 0 && e == ENOTDIR && is_symlink_at(cur, comp))
			e = ELOOP;   /* O_NOFOLLOW on a symlink to a directory */
		if (cur != dirfd)
			close(cur);
		if (fd < 0)
			return -e;
		cur = fd;
		comp = next;
	}
	fd = openat(cur, comp, flags | O_NOFOLLOW, mode);
	e = errno;
	if (fd < 0 && e == ENOTDIR && (flags & O_DIRECTORY) && is_symlink_at(cur, comp))
		e = ELOOP;
	if (fd >= 0 && (flags & O_PATH)) {
		struct stat st;

		/* O_PATH | O_NOFOLLOW opens the symlink itself. */
		if (fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
			close(fd);
			fd = -1;
			e = ELOOP;
		}
	}
	if (cur != dirfd)
		close(cur);
	return fd < 0 ? -e : fd;
}

int io_openat(int dirfd, const char *rel, int flags, mode_t mode)
{
	bool nonblock = !(flags & O_NONBLOCK) && !(flags & O_PATH);
	int fd = -1, tries = 0;

	if (!rel || !rel[0])
		return -ENOENT;
	if (escapes(rel))
		return -EXDEV;
	flags |= O_CLOEXEC;
	if (nonblock)
		flags |= O_NONBLOCK;
	if (!(flags & O_CREAT) && (flags & O_TMPFILE) != O_TMPFILE)
		mode = 0;   /* openat2 refuses a mode it would not use */
	while (have_openat2 && !force_walk) {
		struct open_how how;

		memset(&how, 0, sizeof(how));
		how.flags = (uint64_t)flags;
		how.mode = mode;
		how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
		fd = (int)syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
		if (fd >= 0)
			break;
		if (errno == ENOSYS) {
			have_openat2 = false;
			break;
		}
		/* EAGAIN: a rename raced the lookup; try again a few times. */
		if (errno != EAGAIN || ++tries > 8)
			return -errno;
	}
	if (fd < 0) {
		fd = walk_open(dirfd, rel, flags, mode);
		if (fd < 0)
			return fd;
	}
	if (nonblock) {
		int fl = fcntl(fd, F_GETFL);

		if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
			int e = errno;

			close(fd);
			return -e;
		}
	}
	return fd;
}

int io_open_file(const char *path, int flags, mode_t mode)
{
	const char *slash = strrchr(path, '/');
	char dir[PATH_MAX];
	size_t n;
	int dfd, fd;

	if (!slash)
		return io_openat(AT_FDCWD, path, flags, mode);
	n = slash == path ? 1 : (size_t)(slash - path);
	if (n >= sizeof(dir))
		return -ENAMETOOLONG;
	memcpy(dir, path, n);
	dir[n] = '\0';
	dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	fd = io_openat(dfd, slash[1] ? slash + 1 : ".", flags, mode);
	close(dfd);
	return fd;
}

/* --- reading whole files ----------------------------------------------- */

static void drop(char *buf, size_t len)
{
	if (buf) {
		explicit_bzero(buf, len);
		free(buf);
	}
}

/* Read fd (closed here) to its end; see io_read_file. */
static int read_fd(int fd, size_t max_bytes, char **ret, size_t *ret_len)
{
	struct stat st;
	char *buf = NULL;
	size_t len = 0, cap, limit;
	int r = 0;

	/* The buffer never grows past max_bytes + 1 data bytes (one more than
	 * allowed tells an over-long file) plus the NUL. */
	if (max_bytes > SIZE_MAX - 2)
		max_bytes = SIZE_MAX - 2;
	limit = max_bytes + 2;
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

int io_read_file(const char *path, size_t max_bytes, char **ret, size_t *ret_len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	return read_fd(fd, max_bytes, ret, ret_len);
}

int io_read_file_at(int dirfd, const char *rel, size_t max_bytes, char **ret,
		    size_t *ret_len)
{
	int fd = io_openat(dirfd, rel, O_RDONLY, 0);

	if (fd < 0)
		return fd;
	return read_fd(fd, max_bytes, ret, ret_len);
}
