/* paths.c — path confinement under the checkpoint and model roots (see
 * paths.h). path_confine checks a path by name (lexically, then the
 * existing part with lstat + realpath): the early refusal with clear
 * messages. paths_pin is the check that counts: the kernel resolves the
 * path beneath an O_PATH descriptor of the root (openat2 RESOLVE_BENEATH;
 * on kernels without openat2, one O_NOFOLLOW component at a time) and the
 * directory stays pinned by its descriptor while the engine uses it, so a
 * rename or a symlink swapped in after the check changes nothing. */
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <linux/openat2.h>

static bool within(const char *root, const char *p)
{
	size_t n = strlen(root);

	if (strcmp(root, "/") == 0)
		return true;
	return strncmp(p, root, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

char *paths_normalize(const char *rel)
{
	size_t n = strlen(rel);
	char *out = malloc(n + 1), *o = out;
	const char *p = rel;

	if (!out)
		return NULL;
	while (*p) {
		const char *q = p;
		size_t len;

		while (*q && *q != '/')
			q++;
		len = (size_t)(q - p);
		if (len > 0 && !(len == 1 && p[0] == '.')) {
			if (o != out)
				*o++ = '/';
			memcpy(o, p, len);
			o += len;
		}
		p = *q ? q + 1 : q;
	}
	*o = '\0';
	return out;
}

int path_confine(const char *root_real, const char *rel, const char *field,
		 bool must_exist, char **ret_abs, struct eng_error *err)
{
	char cur[PATH_MAX], cand[PATH_MAX], res[PATH_MAX];
	char *norm, *comp, *save = NULL;
	struct stat st;
	size_t used;

	if (!rel || !rel[0])
		return eng_fail(err, -EINVAL, "%s: empty path", field);
	if (rel[0] == '/')
		return eng_fail(err, -EPERM,
				"%s: absolute path '%s' refused (paths are relative to the root)",
				field, rel);
	if (strlen(rel) >= PATH_MAX - strlen(root_real) - 2)
		return eng_fail(err, -EINVAL, "%s: path too long", field);
	norm = paths_normalize(rel);
	if (!norm)
		return -ENOMEM;
	if (!norm[0]) {
		free(norm);
		return eng_fail(err, -EINVAL, "%s: path '%s' names the root itself",
				field, rel);
	}
	strcpy(cur, root_real);
	for (comp = strtok_r(norm, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
		if (strcmp(comp, "..") == 0) {
			free(norm);
			return eng_fail(err, -EPERM, "%s: '..' in path '%s' refused",
					field, rel);
		}
	}
	free(norm);

	/* Second pass: resolve the existing prefix. */
	norm = paths_normalize(rel);
	if (!norm)
		return -ENOMEM;
	save = NULL;
	for (comp = strtok_r(norm, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
		if ((size_t)snprintf(cand, sizeof(cand), "%s/%s",
				     strcmp(cur, "/") ? cur : "", comp) >= sizeof(cand))
			goto too_long;
		if (lstat(cand, &st) < 0) {
			if (errno != ENOENT) {
				free(norm);
				return eng_fail(err, -EPERM, "%s: cannot inspect '%s'",
						field, rel);
			}
			if (must_exist) {
				free(norm);
				return eng_fail(err, -ENOENT, "%s: '%s' does not exist",
						field, rel);
			}
			/* The rest does not exist: append it literally. */
			used = strlen(cand);
			strcpy(cur, cand);
			for (comp = strtok_r(NULL, "/", &save); comp;
			     comp = strtok_r(NULL, "/", &save)) {
				if (used + 1 + strlen(comp) >= sizeof(cur))
					goto too_long;
				cur[used++] = '/';
				strcpy(cur + used, comp);
				used += strlen(comp);
			}
			break;
		}
		if (!realpath(cand, res)) {
			free(norm);
			return eng_fail(err, -EPERM,
					"%s: '%s' contains a symlink that does not resolve",
					field, rel);
		}
		if (!within(root_real, res)) {
			free(norm);
			return eng_fail(err, -EPERM, "%s: '%s' escapes the root", field, rel);
		}
		strcpy(cur, res);
	}
	free(norm);
	if (strcmp(cur, root_real) == 0)
		return eng_fail(err, -EINVAL, "%s: path '%s' names the root itself",
				field, rel);
	*ret_abs = strdup(cur);
	if (!*ret_abs)
		return -ENOMEM;
	return 0;

too_long:
	free(norm);
	return eng_fail(err, -EINVAL, "%s: path too long", field);
}

static int mkdir_p(char *path)
{
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(path, 0755) < 0 && errno != EEXIST) {
			*p = '/';
			return -errno;
		}
		*p = '/';
	}
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int paths_prepare_root(const char *dir, char **ret, struct eng_error *err)
{
	char buf[PATH_MAX], res[PATH_MAX];
	int r;

	if (strlen(dir) >= sizeof(buf))
		return eng_fail(err, -EINVAL, "%s: path too long", dir);
	strcpy(buf, dir);
	r = mkdir_p(buf);
	if (r < 0)
		return eng_fail(err, r, "%s: cannot create: %s", dir, strerror(-r));
	if (!realpath(dir, res))
		return eng_fail(err, -errno, "%s: cannot resolve: %s", dir,
				strerror(errno));
	*ret = strdup(res);
	return *ret ? 0 : -ENOMEM;
}

int paths_make_parents(const char *abs, struct eng_error *err)
{
	char buf[PATH_MAX];
	char *slash;
	int r;

	if (strlen(abs) >= sizeof(buf))
		return eng_fail(err, -EINVAL, "path too long");
	strcpy(buf, abs);
	slash = strrchr(buf, '/');
	if (!slash || slash == buf)
		return 0;
	*slash = '\0';
	r = mkdir_p(buf);
	if (r < 0)
		return eng_fail(err, eng_errno_code(-r), "cannot create '%s': %s", buf,
				strerror(-r));
	return 0;
}

/* --- pinned locations (openat2) ----------------------------------------- */

static bool have_openat2 = true;  /* cleared on ENOSYS (kernels < 5.6) */

/* openat2(RESOLVE_BENEATH) of a directory; on kernels without openat2,
 * the same walk one component at a time with O_NOFOLLOW (stricter: no
 * symlink at all). */
static int open_dir_beneath(int root_fd, const char *rel)
{
	struct open_how how;
	char buf[PATH_MAX], *comp, *save = NULL;
	int fd, next;

	if (have_openat2) {
		memset(&how, 0, sizeof(how));
		how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
		how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
		fd = (int)syscall(SYS_openat2, root_fd, rel, &how, sizeof(how));
		if (fd >= 0 || errno != ENOSYS)
			return fd;
		have_openat2 = false;
	}
	if (strlen(rel) >= sizeof(buf)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(buf, rel);
	fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
	for (comp = strtok_r(buf, "/", &save); comp && fd >= 0;
	     comp = strtok_r(NULL, "/", &save)) {
		if (!strcmp(comp, "..")) {
			close(fd);
			errno = EXDEV;
			return -1;
		}
		next = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0 && errno == ENOTDIR) {
			struct stat st;

			/* O_NOFOLLOW on a symlink to a directory gives ENOTDIR. */
			if (fstatat(fd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
				errno = ELOOP;
		}
		close(fd);
		fd = next;
	}
	return fd;
}

static int pin_fail(int e, const char *field, const char *rel, struct eng_error *err)
{
	switch (e) {
	case EXDEV:
	case ELOOP:
		return eng_fail(err, -EPERM, "%s: '%s' escapes the root (through '..' or a symlink)",
				field, rel);
	case ENOENT:
		return eng_fail(err, -ENOENT, "%s: '%s' does not exist", field, rel);
	case ENOTDIR:
		return eng_fail(err, -EINVAL, "%s: '%s': a component is not a directory",
				field, rel);
	case EACCES:
	case EPERM:
		return eng_fail(err, -EPERM, "%s: '%s': permission denied", field, rel);
	case EAGAIN:
		return eng_fail(err, -EPERM, "%s: '%s' changed while being resolved", field, rel);
	default:
		/* ENOSPC, EROFS, EMFILE, ...: the one errno mapping. */
		return eng_fail(err, eng_errno_code(e), "%s: '%s': %s", field, rel, strerror(e));
	}
}

void paths_unpin(struct paths_pin *p)
{
	if (p->fd >= 0)
		close(p->fd);
	p->fd = -1;
}

int paths_pin(const char *root_real, const char *rel, const char *field,
	      enum paths_pin_mode mode, struct paths_pin *ret, struct eng_error *err)
{
	char *abs = NULL, *norm, *last, prefix[PATH_MAX];
	int root_fd, fd = -1, r, e;
	struct stat st;

	/* A first check by name (absolute, "..", the root itself, symlinks
	 * out as they are now), with the messages clients know; the kernel's
	 * resolution below is the one that counts. */
	r = path_confine(root_real, rel, field, mode == PIN_DIR, &abs, err);
	if (r < 0)
		return r;
	free(abs);
	norm = paths_normalize(rel);
	if (!norm)
		return -ENOMEM;
	root_fd = open(root_real, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0) {
		r = eng_fail(err, eng_errno_code(errno), "%s: cannot open the root: %s", field,
			     strerror(errno));
		free(norm);
		return r;
	}
	if (mode == PIN_DIR) {
		fd = open_dir_beneath(root_fd, norm);
		if (fd < 0) {
			r = pin_fail(errno, field, rel, err);
			goto out;
		}
		snprintf(ret->path, sizeof(ret->path), "/proc/self/fd/%d", fd);
		snprintf(ret->shown, sizeof(ret->shown), "%s", norm);
		goto done;
	}

	/* PIN_PARENT_CREATE: walk the parents, creating what is missing;
	 * each directory is made inside one that is already pinned. */
	last = strrchr(norm, '/');
	ret->shown[0] = '\0';
	if (!last) {
		fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
		last = norm;
	} else {
		char *p = norm;
		int parent_fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);

		*last++ = '\0';
		while (parent_fd >= 0) {
			char *slash = strchr(p, '/');
			size_t n = slash ? (size_t)(slash - norm) : strlen(norm);
			const char *comp;

			memcpy(prefix, norm, n);
			prefix[n] = '\0';
			comp = strrchr(prefix, '/') ? strrchr(prefix, '/') + 1 : prefix;
			fd = open_dir_beneath(root_fd, prefix);
			if (fd < 0 && errno == ENOENT) {
				if (mkdirat(parent_fd, comp, 0755) < 0 && errno != EEXIST) {
					e = errno;
					close(parent_fd);
					r = pin_fail(e, field, rel, err);
					goto out;
				}
				fd = open_dir_beneath(root_fd, prefix);
			}
			e = errno;
			close(parent_fd);
			parent_fd = -1;
			if (fd < 0) {
				r = pin_fail(e, field, rel, err);
				goto out;
			}
			if (!slash)
				break;
			p = slash + 1;
			parent_fd = fd;
		}
		if (fd < 0) {
			r = pin_fail(errno, field, rel, err);
			goto out;
		}
	}
	if (fd < 0) {
		r = pin_fail(errno, field, rel, err);
		goto out;
	}
	if (fstatat(fd, last, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
		r = eng_fail(err, -EPERM, "%s: '%s' is a symlink (refused)", field, rel);
		goto out;
	}
	snprintf(ret->path, sizeof(ret->path), "/proc/self/fd/%d/%s", fd, last);
	if (last != norm)
		snprintf(ret->shown, sizeof(ret->shown), "%s", norm);  /* the parent */
done:
	ret->fd = fd;
	fd = -1;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	close(root_fd);
	free(norm);
	return r;
}

static void pin_fix_message(const struct paths_pin *p, struct eng_error *err)
{
	char prefix[48], out[sizeof(err->msg)], *hit;
	size_t n;

	if (p->fd < 0)
		return;
	n = (size_t)snprintf(prefix, sizeof(prefix), "/proc/self/fd/%d", p->fd);
	hit = strstr(err->msg, prefix);
	if (!hit)
		return;
	if ((size_t)snprintf(out, sizeof(out), "%.*s<root>%s%s%s", (int)(hit - err->msg),
			     err->msg, p->shown[0] ? "/" : "", p->shown, hit + n) >= sizeof(out))
		return;  /* would not fit: keep the message as it is */
	memcpy(err->msg, out, sizeof(out));
}

int paths_pin_result(const struct paths_pin *p, int r, struct eng_error *err)
{
	struct stat st;

	if (r >= 0 || p->fd < 0)
		return r;
	if (fstat(p->fd, &st) == 0 && st.st_nlink == 0) {
		eng_error_clear(err);
		return eng_fail(err, -ENOENT,
				"path: the directory '%s' was removed or replaced while in use; "
				"nothing was written outside the root", p->shown[0] ? p->shown : ".");
	}
	pin_fix_message(p, err);
	return r;
}
