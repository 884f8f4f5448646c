/* checkpoint.c — crash-safe checkpoint directories (see checkpoint.h).
 *
 * Crash safety rests on three ordered steps: (1) every file of the new
 * checkpoint and its directory are fsync'ed under a hidden temporary name;
 * (2) one rename (or an atomic exchange with an existing checkpoint of the
 * same name) makes it visible, and the parent is fsync'ed; (3) `latest` is
 * replaced by rename of an fsync'ed temporary file. Before (2) the new
 * checkpoint does not exist under its name; after it, it is complete.
 * Hidden entries `.<name>.tmp-<pid>` / `.<name>.del-<pid>` belong to a writer
 * (or a removal in progress); readers and rotation skip them and the next
 * writer in the parent removes those whose process is gone.
 */
#include "checkpoint.h"
#include "../io/fileio.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../io/safetensors.h"

#define STATE_FILE "engine_state.json"
#define LATEST_FILE "latest"

struct ckpt_file {
	char *name;
	uint64_t bytes;
	uint64_t xxh64;
};

struct ckpt_writer {
	char *parent;     /* "/ckpt/run1" */
	char *name;       /* "step_100" */
	char *final;      /* "/ckpt/run1/step_100" */
	char *tmp;        /* "/ckpt/run1/.step_100.tmp-<pid>" */
	char *pathbuf;    /* ckpt_writer_path() result */
	size_t pathcap;
	struct ckpt_file *files;
	int nfiles, cap;
	struct ckpt_writer *next;   /* in active_writers */
};

/* Writers of this process that are in progress: a temporary directory of
 * our own pid is stale only if no live writer owns it (our pid may be the
 * one a crashed predecessor had, e.g. in a container). */
static pthread_mutex_t active_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ckpt_writer *active_writers;

static char *path_join(const char *dir, const char *name)
{
	char *p;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

/* A checkpoint or file name: one path component, not hidden. */
static bool plain_name(const char *s)
{
	return s && *s && s[0] != '.' && !strchr(s, '/') && strlen(s) <= NAME_MAX - 32;
}

static int fsync_path(const char *path, struct eng_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int rc = 0;

	if (fd < 0)
		return eng_fail(err, eng_errno_code(errno), "%s: open for fsync: %s", path,
				strerror(errno));
	if (fsync(fd))
		rc = eng_fail(err, -EIO, "%s: fsync: %s", path, strerror(errno));
	close(fd);
	return rc;
}

/* Create/truncate `path` with `data`, fsync'ed. */
static int write_file(const char *path, const void *data, size_t len, struct eng_error *err)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int rc;

	if (fd < 0)
		return eng_fail(err, eng_errno_code(errno), "%s: cannot create: %s", path,
				strerror(errno));
	rc = io_write_full(fd, data, len);
	if (rc) {
		close(fd);
		return eng_fail(err, eng_errno_code(-rc), "%s: write: %s", path, strerror(-rc));
	}
	if (fsync(fd)) {
		rc = eng_fail(err, -EIO, "%s: fsync: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	if (close(fd))
		return eng_fail(err, -EIO, "%s: close: %s", path, strerror(errno));
	return 0;
}

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)type;
	(void)ftw;
	if (remove(path) && errno != ENOENT)
		return -1;
	return 0;
}

/* Remove a file or a directory tree without following symlinks. */
static int rm_rf(const char *path)
{
	struct stat sb;

	if (lstat(path, &sb))
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(sb.st_mode))
		return remove(path) && errno != ENOENT ? -errno : 0;
	return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) ? -EIO : 0;
}

/* pid of a hidden writer entry `.<x>.tmp-<pid>` / `.<x>.del-<pid>`, or 0. */
static pid_t temp_entry_pid(const char *name)
{
	const char *t = strrchr(name, '.');
	char *end;
	long pid;

	if (name[0] != '.' || !t || t == name)
		return 0;
	if (strncmp(t, ".tmp-", 5) && strncmp(t, ".del-", 5))
		return 0;
	if (!isdigit((unsigned char)t[5]))
		return 0;
	errno = 0;
	pid = strtol(t + 5, &end, 10);
	if (*end || errno || pid <= 0 || pid > INT_MAX)
		return 0;
	return (pid_t)pid;
}

/* Caller holds active_lock. */
static bool owned_by_live_writer(const char *path)
{
	struct ckpt_writer *w;

	for (w = active_writers; w; w = w->next)
		if (!strcmp(w->tmp, path))
			return true;
	return false;
}

/* Remove the temporary entries of writers that are gone. Caller holds
 * active_lock. Best effort: an entry that cannot be removed stays hidden. */
static void remove_stale(const char *parent)
{
	DIR *d = opendir(parent);
	struct dirent *de;
	pid_t self = getpid();

	if (!d)
		return;
	while ((de = readdir(d))) {
		pid_t pid = temp_entry_pid(de->d_name);
		char *p;

		if (!pid)
			continue;
		if (pid != self && !(kill(pid, 0) < 0 && errno == ESRCH))
			continue;   /* another live process may be writing */
		p = path_join(parent, de->d_name);
		if (p && !(pid == self && owned_by_live_writer(p)))
			(void)rm_rf(p);
		free(p);
	}
	closedir(d);
}

static void writer_free(struct ckpt_writer *w)
{
	struct ckpt_writer **pp;
	int i;

	pthread_mutex_lock(&active_lock);
	for (pp = &active_writers; *pp; pp = &(*pp)->next) {
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	}
	pthread_mutex_unlock(&active_lock);
	for (i = 0; i < w->nfiles; i++)
		free(w->files[i].name);
	free(w->files);
	free(w->parent);
	free(w->name);
	free(w->final);
	free(w->tmp);
	free(w->pathbuf);
	free(w);
}

int ckpt_writer_begin(const char *dir, struct ckpt_writer **ret, struct eng_error *err)
{
	struct ckpt_writer *w;
	struct stat sb;
	char *copy, *slash;
	size_t len;
	int rc = 0;

	if (!dir || dir[0] != '/')
		return eng_fail(err, -EINVAL, "checkpoint path '%s' is not absolute",
				dir ? dir : "(null)");
	copy = strdup(dir);
	if (!copy)
		return eng_fail(err, -ENOMEM, "%s: no memory", dir);
	len = strlen(copy);
	while (len > 1 && copy[len - 1] == '/')
		copy[--len] = '\0';
	slash = strrchr(copy, '/');
	*slash = '\0';
	if (!plain_name(slash + 1) || !strcmp(slash + 1, LATEST_FILE)) {
		rc = eng_fail(err, -EINVAL, "checkpoint name '%s' must be one non-hidden path "
			      "component other than 'latest'", slash + 1);
		free(copy);
		return rc;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		free(copy);
		return eng_fail(err, -ENOMEM, "%s: no memory", dir);
	}
	w->parent = strdup(copy[0] ? copy : "/");
	w->name = strdup(slash + 1);
	free(copy);
	if (w->parent && w->name) {
		w->final = path_join(w->parent, w->name);
		if (asprintf(&w->tmp, "%s/.%s.tmp-%ld", w->parent, w->name, (long)getpid()) < 0)
			w->tmp = NULL;
	}
	if (w->tmp) {
		/* Sized for any file name, so that ckpt_writer_path() does not
		 * fail in practice. */
		w->pathcap = strlen(w->tmp) + NAME_MAX + 2;
		w->pathbuf = malloc(w->pathcap);
	}
	if (!w->parent || !w->name || !w->final || !w->tmp || !w->pathbuf) {
		writer_free(w);
		return eng_fail(err, -ENOMEM, "%s: no memory", dir);
	}
	if (stat(w->parent, &sb) || !S_ISDIR(sb.st_mode)) {
		rc = eng_fail(err, -ENOENT, "%s: parent directory of the checkpoint does not "
			      "exist", w->parent);
		writer_free(w);
		return rc;
	}
	pthread_mutex_lock(&active_lock);
	remove_stale(w->parent);
	if (owned_by_live_writer(w->tmp)) {
		pthread_mutex_unlock(&active_lock);
		rc = eng_fail(err, -EALREADY, "%s: a save of this checkpoint is in progress",
			      w->final);
		writer_free(w);
		return rc;
	}
	(void)rm_rf(w->tmp);
	if (mkdir(w->tmp, 0755)) {
		int e = errno;

		pthread_mutex_unlock(&active_lock);
		rc = eng_fail(err, eng_errno_code(e), "%s: mkdir: %s", w->tmp, strerror(e));
		writer_free(w);
		return rc;
	}
	w->next = active_writers;
	active_writers = w;
	pthread_mutex_unlock(&active_lock);
	*ret = w;
	return 0;
}

const char *ckpt_writer_path(struct ckpt_writer *w, const char *name)
{
	size_t need = strlen(w->tmp) + strlen(name) + 2;

	if (need > w->pathcap) {
		char *p = realloc(w->pathbuf, need);

		if (!p)
			return NULL;
		w->pathbuf = p;
		w->pathcap = need;
	}
	snprintf(w->pathbuf, w->pathcap, "%s/%s", w->tmp, name);
	return w->pathbuf;
}

int ckpt_writer_record(struct ckpt_writer *w, const char *name, uint64_t bytes,
		       uint64_t xxh64, struct eng_error *err)
{
	struct ckpt_file *f;
	struct stat sb;
	char *p;
	int i, rc;

	if (!plain_name(name) || !strcmp(name, STATE_FILE))
		return eng_fail(err, -EINVAL, "checkpoint file name '%s' is not a plain file "
				"name or is reserved", name ? name : "(null)");
	for (i = 0; i < w->nfiles; i++)
		if (!strcmp(w->files[i].name, name))
			return eng_fail(err, -EINVAL, "checkpoint file '%s' recorded twice", name);
	p = path_join(w->tmp, name);
	if (!p)
		return eng_fail(err, -ENOMEM, "%s: no memory", name);
	if (stat(p, &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != bytes) {
		rc = eng_fail(err, -EINVAL, "%s: missing, not a file, or not %llu bytes long",
			      p, (unsigned long long)bytes);
		free(p);
		return rc;
	}
	free(p);
	if (w->nfiles == w->cap) {
		int ncap = w->cap ? 2 * w->cap : 8;

		f = realloc(w->files, (size_t)ncap * sizeof(*f));
		if (!f)
			return eng_fail(err, -ENOMEM, "%s: no memory", name);
		w->files = f;
		w->cap = ncap;
	}
	f = &w->files[w->nfiles];
	f->name = strdup(name);
	if (!f->name)
		return eng_fail(err, -ENOMEM, "%s: no memory", name);
	f->bytes = bytes;
	f->xxh64 = xxh64;
	w->nfiles++;
	return 0;
}

int ckpt_writer_put(struct ckpt_writer *w, const char *name, const void *data,
		    size_t len, struct eng_error *err)
{
	const char *p;
	int rc;

	if (!plain_name(name) || !strcmp(name, STATE_FILE))
		return eng_fail(err, -EINVAL, "checkpoint file name '%s' is not a plain file "
				"name or is reserved", name ? name : "(null)");
	p = ckpt_writer_path(w, name);
	if (!p)
		return eng_fail(err, -ENOMEM, "%s: no memory", name);
	rc = write_file(p, data, len, err);
	if (rc)
		return rc;
	return ckpt_writer_record(w, name, len, XXH64(data, len, 0), err);
}

void ckpt_writer_abort(struct ckpt_writer *w)
{
	if (!w)
		return;
	(void)rm_rf(w->tmp);
	writer_free(w);
}

/* Put the complete temporary directory in place under w->final. An
 * existing checkpoint of that name is exchanged atomically, so the name
 * never refers to nothing or to a partial directory; the old one ends up
 * under the temporary name and is removed. */
static int install(struct ckpt_writer *w, struct eng_error *err)
{
	int rc;

	if (renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->final, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno == EEXIST) {
		if (renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->final, RENAME_EXCHANGE) == 0) {
			(void)rm_rf(w->tmp);
			return 0;
		}
		if (errno != EINVAL && errno != ENOSYS)
			return eng_fail(err, eng_errno_code(errno), "%s: exchange with %s: %s",
					w->tmp, w->final, strerror(errno));
	} else if (errno != EINVAL && errno != ENOSYS) {
		return eng_fail(err, eng_errno_code(errno), "%s: rename to %s: %s", w->tmp,
				w->final, strerror(errno));
	}
	/* No renameat2 flags on this file system: plain rename(2), which
	 * replaces an empty directory only, so move the old one aside first.
	 * A crash between the two renames leaves the old checkpoint hidden
	 * (not lost) under `.<name>.del-<pid>`. */
	{
		char *aside;

		if (asprintf(&aside, "%s/.%s.del-%ld", w->parent, w->name, (long)getpid()) < 0)
			return eng_fail(err, -ENOMEM, "%s: no memory", w->final);
		(void)rm_rf(aside);
		if (rename(w->final, aside) && errno != ENOENT) {
			rc = eng_fail(err, eng_errno_code(errno), "%s: rename aside: %s", w->final,
				      strerror(errno));
			free(aside);
			return rc;
		}
		if (rename(w->tmp, w->final)) {
			rc = eng_fail(err, eng_errno_code(errno), "%s: rename to %s: %s", w->tmp,
				      w->final, strerror(errno));
			(void)rename(aside, w->final);
			free(aside);
			return rc;
		}
		(void)rm_rf(aside);
		free(aside);
	}
	return 0;
}

static int update_latest(struct ckpt_writer *w, struct eng_error *err)
{
	char *tmp, *latest;
	int rc;

	if (asprintf(&tmp, "%s/.%s.tmp-%ld", w->parent, LATEST_FILE, (long)getpid()) < 0)
		return eng_fail(err, -ENOMEM, "%s: no memory", w->parent);
	latest = path_join(w->parent, LATEST_FILE);
	if (!latest) {
		free(tmp);
		return eng_fail(err, -ENOMEM, "%s: no memory", w->parent);
	}
	rc = write_file(tmp, w->name, strlen(w->name), err);
	if (!rc && rename(tmp, latest))
		rc = eng_fail(err, eng_errno_code(errno), "%s: rename: %s", latest, strerror(errno));
	if (rc)
		(void)unlink(tmp);
	if (!rc)
		rc = fsync_path(w->parent, err);
	free(tmp);
	free(latest);
	return rc;
}

/* global_step recorded in <dir>/engine_state.json, or -1 when there is no
 * valid one (such directories are not checkpoints and never rotated). */
static int64_t recorded_step(const char *dir)
{
	char *p = path_join(dir, STATE_FILE);
	json_t *s, *g;
	int64_t step = -1;

	if (!p)
		return -1;
	s = json_load_file(p, 0, NULL);
	free(p);
	g = json_object_get(s, "global_step");
	if (json_is_integer(g) && json_integer_value(g) >= 0)
		step = json_integer_value(g);
	json_decref(s);
	return step;
}

struct rot_entry {
	char *name;
	int64_t step;
};

/* Newest first: larger step, then larger name. */
static int cmp_rot(const void *a, const void *b)
{
	const struct rot_entry *x = a, *y = b;

	if (x->step != y->step)
		return x->step > y->step ? -1 : 1;
	return -strcmp(x->name, y->name);
}

/* Keep w->name and the newest max_to_keep - 1 other checkpoints of the
 * parent; remove the rest (renamed to a hidden name first, so that a
 * half-removed one never looks like a checkpoint). */
static int rotate(struct ckpt_writer *w, int max_to_keep, struct eng_error *err)
{
	struct rot_entry *e = NULL;
	struct dirent *de;
	size_t n = 0, cap = 0, i, kept = 1;
	DIR *d;
	int rc = 0;

	d = opendir(w->parent);
	if (!d)
		return eng_fail(err, eng_errno_code(errno), "%s: opendir for rotation: %s",
				w->parent, strerror(errno));
	while ((de = readdir(d))) {
		struct stat sb;
		char *p;
		int64_t step;

		if (de->d_name[0] == '.' || !strcmp(de->d_name, w->name))
			continue;
		p = path_join(w->parent, de->d_name);
		if (!p) {
			rc = eng_fail(err, -ENOMEM, "rotation: no memory");
			break;
		}
		step = !lstat(p, &sb) && S_ISDIR(sb.st_mode) ? recorded_step(p) : -1;
		free(p);
		if (step < 0)
			continue;
		if (n == cap) {
			struct rot_entry *ne;

			cap = cap ? 2 * cap : 16;
			ne = realloc(e, cap * sizeof(*e));
			if (!ne) {
				rc = eng_fail(err, -ENOMEM, "rotation: no memory");
				break;
			}
			e = ne;
		}
		e[n].name = strdup(de->d_name);
		if (!e[n].name) {
			rc = eng_fail(err, -ENOMEM, "rotation: no memory");
			break;
		}
		e[n++].step = step;
	}
	closedir(d);
	if (!rc && n > 1)   /* e is NULL when no other checkpoint was found */
		qsort(e, n, sizeof(*e), cmp_rot);
	for (i = 0; !rc && i < n; i++) {
		char *from, *aside;

		if (kept < (size_t)max_to_keep) {
			kept++;
			continue;
		}
		from = path_join(w->parent, e[i].name);
		if (!from || asprintf(&aside, "%s/.%s.del-%ld", w->parent, e[i].name,
				      (long)getpid()) < 0) {
			free(from);
			rc = eng_fail(err, -ENOMEM, "rotation: no memory");
			break;
		}
		(void)rm_rf(aside);
		if (rename(from, aside) || rm_rf(aside))
			rc = eng_fail(err, -EIO, "%s: checkpoint saved, but removing this old "
				      "checkpoint failed: %s", from, strerror(errno));
		free(from);
		free(aside);
	}
	for (i = 0; i < n; i++)
		free(e[i].name);
	free(e);
	if (!rc)
		rc = fsync_path(w->parent, err);
	return rc;
}

int ckpt_writer_commit(struct ckpt_writer *w, json_t *state_json, int max_to_keep,
		       uint64_t *ret_bytes, struct eng_error *err)
{
	json_t *state = NULL, *files = NULL;
	uint64_t total = 0;
	char *text = NULL, *path;
	int rc = 0, i;

	if (!json_is_object(state_json)) {
		rc = eng_fail(err, -EINVAL, "%s: engine state is not a JSON object", w->final);
		goto fail;
	}
	state = json_copy(state_json);
	files = json_object();
	if (!state || !files) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", w->final);
		goto fail;
	}
	for (i = 0; i < w->nfiles; i++) {
		char hex[17];

		snprintf(hex, sizeof(hex), "%016" PRIx64, w->files[i].xxh64);
		if (json_object_set_new(files, w->files[i].name,
					json_pack("{s:I, s:s}", "bytes",
						  (json_int_t)w->files[i].bytes, "xxh64", hex))) {
			rc = eng_fail(err, -ENOMEM, "%s: no memory", w->final);
			goto fail;
		}
		total += w->files[i].bytes;
	}
	if (json_object_set(state, "files", files)) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", w->final);
		goto fail;
	}
	text = json_dumps(state, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	path = text ? (char *)ckpt_writer_path(w, STATE_FILE) : NULL;
	if (!path) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", w->final);
		goto fail;
	}
	rc = write_file(path, text, strlen(text), err);
	if (rc)
		goto fail;
	total += strlen(text);
	rc = fsync_path(w->tmp, err);
	if (rc)
		goto fail;
	rc = install(w, err);
	if (rc)
		goto fail;
	/* From here the checkpoint exists; later failures are reported but the
	 * checkpoint stays. */
	rc = fsync_path(w->parent, err);
	if (!rc)
		rc = update_latest(w, err);
	if (!rc && max_to_keep > 0)
		rc = rotate(w, max_to_keep, err);
	if (!rc && ret_bytes)
		*ret_bytes = total;
	json_decref(state);
	json_decref(files);
	free(text);
	writer_free(w);
	return rc;
fail:
	json_decref(state);
	json_decref(files);
	free(text);
	ckpt_writer_abort(w);
	return rc;
}

/* Verify one "files" entry of engine_state.json. */
static int verify_file(const char *dir, const char *name, json_t *info, struct eng_error *err)
{
	json_t *jb = json_object_get(info, "bytes");
	const char *hex = json_string_value(json_object_get(info, "xxh64"));
	uint64_t want_xxh, got_xxh;
	struct stat sb;
	char *p, *end;
	int rc = 0;

	if (!plain_name(name) || !json_is_integer(jb) || json_integer_value(jb) < 0 || !hex ||
	    strlen(hex) != 16)
		return eng_fail(err, -EBADMSG, "%s/%s: engine_state.json: malformed files "
				"entry for '%s'", dir, STATE_FILE, name);
	errno = 0;
	want_xxh = strtoull(hex, &end, 16);
	if (*end || errno)
		return eng_fail(err, -EBADMSG, "%s/%s: engine_state.json: bad xxh64 '%s' for "
				"'%s'", dir, STATE_FILE, hex, name);
	p = path_join(dir, name);
	if (!p)
		return eng_fail(err, -ENOMEM, "%s: no memory", dir);
	if (stat(p, &sb) || !S_ISREG(sb.st_mode)) {
		rc = eng_fail(err, -EBADMSG, "%s: listed in engine_state.json but missing", p);
	} else if ((uint64_t)sb.st_size != (uint64_t)json_integer_value(jb)) {
		rc = eng_fail(err, -EBADMSG, "%s: %lld bytes, engine_state.json records %lld",
			      p, (long long)sb.st_size, (long long)json_integer_value(jb));
	} else {
		rc = file_xxh64(p, &got_xxh, err);
		if (!rc && got_xxh != want_xxh)
			rc = eng_fail(err, -EBADMSG, "%s: XXH64 %016" PRIx64 " does not match "
				      "%016" PRIx64 " recorded in engine_state.json", p, got_xxh,
				      want_xxh);
	}
	free(p);
	return rc;
}

/* The checkpoint named by <dir>/latest (malloc'ed path) or an error. */
static int follow_latest(const char *dir, char **ret, struct eng_error *err)
{
	char *lp = path_join(dir, LATEST_FILE), buf[NAME_MAX + 2];
	ssize_t n;
	int fd, rc;

	if (!lp)
		return eng_fail(err, -ENOMEM, "%s: no memory", dir);
	fd = open(lp, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = eng_fail(err, errno == ENOENT ? -ENOENT : eng_errno_code(errno),
			      "%s: neither %s nor %s found", dir, STATE_FILE, LATEST_FILE);
		free(lp);
		return rc;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0) {
		rc = eng_fail(err, -EIO, "%s: read: %s", lp, strerror(errno));
		free(lp);
		return rc;
	}
	buf[n] = '\0';
	while (n > 0 && isspace((unsigned char)buf[n - 1]))
		buf[--n] = '\0';
	if (!plain_name(buf)) {
		rc = eng_fail(err, -EBADMSG, "%s: does not hold a checkpoint name", lp);
		free(lp);
		return rc;
	}
	free(lp);
	*ret = path_join(dir, buf);
	return *ret ? 0 : eng_fail(err, -ENOMEM, "%s: no memory", dir);
}

int ckpt_open(const char *dir, json_t **ret_state, char **ret_dir, struct eng_error *err)
{
	char *resolved = NULL, *sp = NULL;
	json_t *state = NULL, *files, *info;
	json_error_t jerr;
	const char *name;
	struct stat sb;
	int rc;

	sp = path_join(dir, STATE_FILE);
	if (!sp)
		return eng_fail(err, -ENOMEM, "%s: no memory", dir);
	if (stat(sp, &sb) == 0) {
		resolved = strdup(dir);
		rc = resolved ? 0 : eng_fail(err, -ENOMEM, "%s: no memory", dir);
	} else {
		rc = follow_latest(dir, &resolved, err);
	}
	free(sp);
	sp = NULL;
	if (rc)
		return rc;
	sp = path_join(resolved, STATE_FILE);
	if (!sp) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", dir);
		goto out;
	}
	if (stat(sp, &sb)) {
		rc = eng_fail(err, errno == ENOENT ? -ENOENT : -EIO, "%s: %s", sp,
			      strerror(errno));
		goto out;
	}
	state = json_load_file(sp, JSON_REJECT_DUPLICATES, &jerr);
	if (!state) {
		rc = eng_fail(err, -EBADMSG, "%s: invalid JSON at line %d: %s", sp, jerr.line,
			      jerr.text);
		goto out;
	}
	files = json_object_get(state, "files");
	if (!json_is_object(state) || !json_is_object(files)) {
		rc = eng_fail(err, -EBADMSG, "%s: not an object with a \"files\" object", sp);
		goto out;
	}
	json_object_foreach(files, name, info) {
		rc = verify_file(resolved, name, info, err);
		if (rc)
			goto out;
	}
out:
	free(sp);
	if (rc) {
		json_decref(state);
		free(resolved);
		return rc;
	}
	*ret_state = state;
	if (ret_dir)
		*ret_dir = resolved;
	else
		free(resolved);
	return 0;
}
