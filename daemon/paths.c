/* paths.c — path confinement under the checkpoint and model roots (see
 * paths.h). Components are resolved one at a time with lstat + realpath so
 * that a symlink anywhere in the existing part of the path is followed and
 * checked; the part that does not exist yet is plain names (no ".."), so
 * whatever is created there stays beneath its resolved parent. */
#include "paths.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

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
		return eng_fail(err, -EIO, "cannot create '%s': %s", buf, strerror(-r));
	return 0;
}
