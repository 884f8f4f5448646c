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
#include "io/fileio.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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

#include "io/safetensors.h"

#define STATE_FILE "engine_state.json"
#define LATEST_FILE "latest"

/* Largest engine_state.json and `latest` read. */
#define STATE_MAX (1u << 20)

struct ckpt_file {
	char *name;
	uint64_t bytes;
	uint64_t xxh64;
};

struct ckpt_writer {
	char *parent;     /* "/ckpt/run1" (as given: messages) */
	char *name;       /* "step_100" */
	char *final;      /* "/ckpt/run1/step_100" */
	char *tmpname;    /* ".step_100.tmp-<pid>" */
	char *tmp;        /* "/ckpt/run1/.step_100.tmp-<pid>" */
	int parent_fd;    /* the parent, opened as given */
	int tmp_fd;       /* the temporary directory, made by this writer */
	dev_t dev;        /* the parent's identity */
	ino_t ino;
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

static int fsync_fd(int fd, const char *shown, struct eng_error *err)
{
	if (fsync(fd))
		return eng_fail(err, eng_errno_code(errno), "%s: fsync: %s", shown,
				strerror(errno));
	return 0;
}

/* Create `name` (new: O_EXCL, never through a symlink) beneath dirfd with
 * `data`, fsync'ed; `shown` in messages. */
static int write_file_at(int dirfd, const char *name, const char *shown, const void *data,
			 size_t len, struct eng_error *err)
{
	int fd = io_openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL, 0644);
	int rc;

	if (fd < 0)
		return eng_fail(err, eng_errno_code(-fd), "%s: cannot create: %s", shown,
				eng_errno_text(-fd));
	rc = io_write_full(fd, data, len);
	if (rc) {
		close(fd);
		return eng_fail(err, eng_errno_code(-rc), "%s: write: %s", shown, strerror(-rc));
	}
	rc = fsync_fd(fd, shown, err);
	if (close(fd) && !rc)
		rc = eng_fail(err, eng_errno_code(errno), "%s: close: %s", shown, strerror(errno));
	return rc;
}

/* Remove entry `name` of parent, a file or a directory tree, following no
 * symlink (a symlink is removed, not what it names). 0 or -errno. */
static int rm_at(int parent, const char *name, int depth)
{
	struct dirent *de;
	struct stat sb;
	DIR *d;
	int fd, rc = 0;

	if (fstatat(parent, name, &sb, AT_SYMLINK_NOFOLLOW))
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(sb.st_mode))
		return unlinkat(parent, name, 0) && errno != ENOENT ? -errno : 0;
	if (depth > 64)
		return -ENOTEMPTY;   /* checkpoints are flat: bounds the descriptors held */
	fd = io_openat(parent, name, O_RDONLY | O_DIRECTORY, 0);
	if (fd < 0)
		return fd;
	d = fdopendir(fd);
	if (!d) {
		rc = -errno;
		close(fd);
		return rc;
	}
	while ((de = readdir(d))) {
		int r;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		r = rm_at(fd, de->d_name, depth + 1);
		if (r && !rc)
			rc = r;
	}
	closedir(d);
	if (unlinkat(parent, name, AT_REMOVEDIR) && errno != ENOENT && !rc)
		rc = -errno;
	return rc;
}

/* A directory stream of dirfd (which stays open), or NULL. */
static DIR *open_dir_stream(int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;

	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d)
		close(fd);
	return d;
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
static bool owned_by_live_writer(dev_t dev, ino_t ino, const char *tmpname)
{
	struct ckpt_writer *w;

	for (w = active_writers; w; w = w->next)
		if (w->dev == dev && w->ino == ino && !strcmp(w->tmpname, tmpname))
			return true;
	return false;
}

/* Remove the temporary entries of writers that are gone. Caller holds
 * active_lock. Best effort: an entry that cannot be removed stays hidden. */
static void remove_stale(struct ckpt_writer *w)
{
	DIR *d = open_dir_stream(w->parent_fd);
	struct dirent *de;
	pid_t self = getpid();

	if (!d)
		return;
	while ((de = readdir(d))) {
		pid_t pid = temp_entry_pid(de->d_name);

		if (!pid)
			continue;
		if (pid != self && !(kill(pid, 0) < 0 && errno == ESRCH))
			continue;   /* another live process may be writing */
		if (!(pid == self && owned_by_live_writer(w->dev, w->ino, de->d_name)))
			(void)rm_at(w->parent_fd, de->d_name, 0);
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
	if (w->tmp_fd >= 0)
		close(w->tmp_fd);
	if (w->parent_fd >= 0)
		close(w->parent_fd);
	free(w->files);
	free(w->parent);
	free(w->name);
	free(w->final);
	free(w->tmpname);
	free(w->tmp);
	free(w->pathbuf);
	free(w);
}

/* The checkpoint path `dir` (absolute; trailing slashes dropped) split in
 * a malloc'ed copy (*ret_copy, caller frees): the parent (the copy itself,
 * "" for "/") and the last component after *ret_slash. */
static int split_path(const char *dir, char **ret_copy, char **ret_slash,
		      struct eng_error *err)
{
	char *copy;

	if (!dir || dir[0] != '/')
		return eng_fail(err, -EINVAL, "checkpoint path '%s' is not absolute",
				dir ? dir : "(null)");
	copy = strdup(dir);
	if (!copy)
		return eng_fail(err, -ENOMEM, "%s: no memory", dir);
	for (size_t len = strlen(copy); len > 1 && copy[len - 1] == '/';)
		copy[--len] = '\0';
	*ret_slash = strrchr(copy, '/');
	**ret_slash = '\0';
	*ret_copy = copy;
	return 0;
}

int ckpt_writer_begin(const char *dir, struct ckpt_writer **ret, struct eng_error *err)
{
	struct ckpt_writer *w;
	struct stat sb;
	char *copy, *slash;
	int rc = 0, e;

	rc = split_path(dir, &copy, &slash, err);
	if (rc)
		return rc;
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
	w->parent_fd = w->tmp_fd = -1;
	w->parent = strdup(copy[0] ? copy : "/");
	w->name = strdup(slash + 1);
	free(copy);
	if (w->parent && w->name) {
		w->final = path_join(w->parent, w->name);
		if (asprintf(&w->tmpname, ".%s.tmp-%ld", w->name, (long)getpid()) < 0)
			w->tmpname = NULL;
		else
			w->tmp = path_join(w->parent, w->tmpname);
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
	/* The parent as given (the daemon's pinned directory); everything
	 * below it is reached through this descriptor. */
	w->parent_fd = open(w->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (w->parent_fd < 0 || fstat(w->parent_fd, &sb)) {
		e = errno;
		rc = e == ENOENT || e == ENOTDIR
		     ? eng_fail(err, -ENOENT, "%s: parent directory of the checkpoint does not "
				"exist", w->parent)
		     : eng_fail(err, eng_errno_code(e), "%s: %s", w->parent, strerror(e));
		writer_free(w);
		return rc;
	}
	w->dev = sb.st_dev;
	w->ino = sb.st_ino;
	pthread_mutex_lock(&active_lock);
	remove_stale(w);
	if (owned_by_live_writer(w->dev, w->ino, w->tmpname)) {
		pthread_mutex_unlock(&active_lock);
		rc = eng_fail(err, -EALREADY, "%s: a save of this checkpoint is in progress",
			      w->final);
		writer_free(w);
		return rc;
	}
	(void)rm_at(w->parent_fd, w->tmpname, 0);
	if (mkdirat(w->parent_fd, w->tmpname, 0755)) {
		e = errno;
		pthread_mutex_unlock(&active_lock);
		rc = eng_fail(err, eng_errno_code(e), "%s: mkdir: %s", w->tmp, strerror(e));
		writer_free(w);
		return rc;
	}
	w->tmp_fd = io_openat(w->parent_fd, w->tmpname, O_RDONLY | O_DIRECTORY, 0);
	if (w->tmp_fd < 0) {
		e = -w->tmp_fd;
		(void)rm_at(w->parent_fd, w->tmpname, 0);
		pthread_mutex_unlock(&active_lock);
		rc = eng_fail(err, eng_errno_code(e), "%s: %s", w->tmp, eng_errno_text(e));
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

int ckpt_writer_dirfd(const struct ckpt_writer *w)
{
	return w->tmp_fd;
}

const char *ckpt_writer_temp_name(const struct ckpt_writer *w)
{
	return w->tmpname;
}

/* ".<name>.tmp-<digits>": the temporary name a writer of `name` uses. */
static bool temp_name_of(const char *tmpname, const char *name)
{
	size_t n = strlen(name);
	const char *p;

	if (tmpname[0] != '.' || strncmp(tmpname + 1, name, n) ||
	    strncmp(tmpname + 1 + n, ".tmp-", 5))
		return false;
	p = tmpname + n + 6;
	if (!*p)
		return false;
	for (; *p; p++)
		if (!isdigit((unsigned char)*p))
			return false;
	return true;
}

int ckpt_join_temp(const char *dir, const char *tmpname, int *ret_fd, struct eng_error *err)
{
	char *copy, *slash;
	int pfd, fd, rc;

	rc = split_path(dir, &copy, &slash, err);
	if (rc)
		return rc;
	if (!plain_name(slash + 1) || !temp_name_of(tmpname, slash + 1)) {
		rc = eng_fail(err, -EINVAL, "%s: '%s' is not the temporary directory of checkpoint "
			      "'%s'", dir, tmpname, slash + 1);
		free(copy);
		return rc;
	}
	pfd = open(copy[0] ? copy : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0) {
		rc = eng_fail(err, eng_errno_code(errno), "%s: %s", copy, strerror(errno));
		free(copy);
		return rc;
	}
	fd = io_openat(pfd, tmpname, O_RDONLY | O_DIRECTORY, 0);
	if (fd < 0)
		rc = eng_fail(err, eng_errno_code(-fd), "%s/%s: %s", copy, tmpname,
			      eng_errno_text(-fd));
	close(pfd);
	free(copy);
	if (rc)
		return rc;
	*ret_fd = fd;
	return 0;
}

int ckpt_writer_record(struct ckpt_writer *w, const char *name, uint64_t bytes,
		       uint64_t xxh64, struct eng_error *err)
{
	struct ckpt_file *f;
	struct stat sb;
	int i;

	if (!plain_name(name) || !strcmp(name, STATE_FILE))
		return eng_fail(err, -EINVAL, "checkpoint file name '%s' is not a plain file "
				"name or is reserved", name ? name : "(null)");
	for (i = 0; i < w->nfiles; i++)
		if (!strcmp(w->files[i].name, name))
			return eng_fail(err, -EINVAL, "checkpoint file '%s' recorded twice", name);
	if (fstatat(w->tmp_fd, name, &sb, AT_SYMLINK_NOFOLLOW) || !S_ISREG(sb.st_mode) ||
	    (uint64_t)sb.st_size != bytes)
		return eng_fail(err, -EINVAL, "%s/%s: missing, not a file, or not %llu bytes long",
				w->tmp, name, (unsigned long long)bytes);
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
	rc = write_file_at(w->tmp_fd, name, p, data, len, err);
	if (rc)
		return rc;
	return ckpt_writer_record(w, name, len, XXH64(data, len, 0), err);
}

void ckpt_writer_abort(struct ckpt_writer *w)
{
	if (!w)
		return;
	(void)rm_at(w->parent_fd, w->tmpname, 0);
	writer_free(w);
}

/* Put the complete temporary directory in place under w->name. An
 * existing checkpoint of that name is exchanged atomically, so the name
 * never refers to nothing or to a partial directory; the old one ends up
 * under the temporary name and is removed. */
static int install(struct ckpt_writer *w, struct eng_error *err)
{
	int pfd = w->parent_fd, rc;

	if (renameat2(pfd, w->tmpname, pfd, w->name, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno == EEXIST) {
		if (renameat2(pfd, w->tmpname, pfd, w->name, RENAME_EXCHANGE) == 0) {
			(void)rm_at(pfd, w->tmpname, 0);
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

		if (asprintf(&aside, ".%s.del-%ld", w->name, (long)getpid()) < 0)
			return eng_fail(err, -ENOMEM, "%s: no memory", w->final);
		(void)rm_at(pfd, aside, 0);
		if (renameat(pfd, w->name, pfd, aside) && errno != ENOENT) {
			rc = eng_fail(err, eng_errno_code(errno), "%s: rename aside: %s", w->final,
				      strerror(errno));
			free(aside);
			return rc;
		}
		if (renameat(pfd, w->tmpname, pfd, w->name)) {
			rc = eng_fail(err, eng_errno_code(errno), "%s: rename to %s: %s", w->tmp,
				      w->final, strerror(errno));
			(void)renameat(pfd, aside, pfd, w->name);
			free(aside);
			return rc;
		}
		(void)rm_at(pfd, aside, 0);
		free(aside);
	}
	return 0;
}

/* Replace `latest` by an fsync'ed temporary renamed over it (a symlink
 * named `latest` is replaced, never written through). */
static int update_latest(struct ckpt_writer *w, struct eng_error *err)
{
	char *tmpname, *shown;
	int rc;

	if (asprintf(&tmpname, ".%s.tmp-%ld", LATEST_FILE, (long)getpid()) < 0)
		return eng_fail(err, -ENOMEM, "%s: no memory", w->parent);
	shown = path_join(w->parent, tmpname);
	if (!shown) {
		free(tmpname);
		return eng_fail(err, -ENOMEM, "%s: no memory", w->parent);
	}
	(void)unlinkat(w->parent_fd, tmpname, 0);
	rc = write_file_at(w->parent_fd, tmpname, shown, w->name, strlen(w->name), err);
	if (!rc && renameat(w->parent_fd, tmpname, w->parent_fd, LATEST_FILE))
		rc = eng_fail(err, eng_errno_code(errno), "%s/%s: rename: %s", w->parent,
			      LATEST_FILE, strerror(errno));
	if (rc)
		(void)unlinkat(w->parent_fd, tmpname, 0);
	if (!rc)
		rc = fsync_fd(w->parent_fd, w->parent, err);
	free(tmpname);
	free(shown);
	return rc;
}

/* global_step recorded in <entry>/engine_state.json beneath dirfd, or -1
 * when there is no valid (intact, sealed) one: such directories are not
 * checkpoints and never rotated. */
static int64_t recorded_step(int dirfd, const char *entry)
{
	char *rel = path_join(entry, STATE_FILE), *text = NULL;
	size_t len = 0;
	json_t *s, *g;
	int64_t step = -1;

	if (!rel)
		return -1;
	if (io_read_file_at(dirfd, rel, STATE_MAX, &text, &len) < 0) {
		free(rel);
		return -1;
	}
	if (ckpt_state_parse(text, len, rel, &s, NULL))
		s = NULL;
	free(text);
	free(rel);
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
 * half-removed one never looks like a checkpoint). Symlinks are never
 * checkpoints: a link to a directory elsewhere is neither read nor
 * removed. */
static int rotate(struct ckpt_writer *w, int max_to_keep, struct eng_error *err)
{
	struct rot_entry *e = NULL;
	struct dirent *de;
	size_t n = 0, cap = 0, i, kept = 1;
	DIR *d;
	int rc = 0;

	d = open_dir_stream(w->parent_fd);
	if (!d)
		return eng_fail(err, eng_errno_code(errno), "%s: checkpoint saved, but reading "
				"the directory for rotation failed: %s", w->parent,
				strerror(errno));
	while ((de = readdir(d))) {
		struct stat sb;
		int64_t step;

		if (de->d_name[0] == '.' || !strcmp(de->d_name, w->name))
			continue;
		step = !fstatat(w->parent_fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) &&
		       S_ISDIR(sb.st_mode) ? recorded_step(w->parent_fd, de->d_name) : -1;
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
		char *aside;
		int r;

		if (kept < (size_t)max_to_keep) {
			kept++;
			continue;
		}
		if (asprintf(&aside, ".%s.del-%ld", e[i].name, (long)getpid()) < 0) {
			rc = eng_fail(err, -ENOMEM, "rotation: no memory");
			break;
		}
		(void)rm_at(w->parent_fd, aside, 0);
		r = renameat(w->parent_fd, e[i].name, w->parent_fd, aside) ? -errno
		    : rm_at(w->parent_fd, aside, 0);
		if (r)
			rc = eng_fail(err, eng_errno_code(-r), "%s/%s: checkpoint saved, but "
				      "removing this old checkpoint failed: %s", w->parent,
				      e[i].name, eng_errno_text(-r));
		free(aside);
	}
	for (i = 0; i < n; i++)
		free(e[i].name);
	free(e);
	if (!rc)
		rc = fsync_fd(w->parent_fd, w->parent, err);
	return rc;
}

int ckpt_writer_commit(struct ckpt_writer *w, json_t *state_json, int max_to_keep,
		       uint64_t *ret_bytes, struct eng_error *err)
{
	json_t *state = NULL, *files = NULL, *v;
	uint64_t total = 0;
	char *text = NULL, *path;
	const char *key;
	int rc = 0, i;

	if (!json_is_object(state_json)) {
		rc = eng_fail(err, -EINVAL, "%s: engine state is not a JSON object", w->final);
		goto fail;
	}
	json_object_foreach(state_json, key, v) {
		if (ckpt_reserved_key(key)) {
			rc = eng_fail(err, -EINVAL, "%s: engine state member '%s' is the "
				      "checkpoint library's", w->final, key);
			goto fail;
		}
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
	rc = ckpt_state_seal(state, err);
	if (rc)
		goto fail;
	text = json_dumps(state, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	path = text ? (char *)ckpt_writer_path(w, STATE_FILE) : NULL;
	if (!path) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", w->final);
		goto fail;
	}
	rc = write_file_at(w->tmp_fd, STATE_FILE, path, text, strlen(text), err);
	if (rc)
		goto fail;
	total += strlen(text);
	rc = fsync_fd(w->tmp_fd, w->tmp, err);
	if (rc)
		goto fail;
	rc = install(w, err);
	if (rc)
		goto fail;
	/* From here the checkpoint exists; later failures are reported (saying
	 * so) but the checkpoint stays. */
	{
		struct eng_error e2 = { 0 };

		rc = fsync_fd(w->parent_fd, w->parent, &e2);
		if (!rc)
			rc = update_latest(w, &e2);
		if (rc)
			rc = eng_fail(err, rc, "%s: checkpoint saved, but `latest` was not "
				      "updated: %s", w->final, e2.msg);
	}
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

/* Bytes verified of all the listed files (ckpt_open_progress). */
struct verify_count {
	const struct ckpt_open_opts *p;
	uint64_t base, total;
};

static void verify_progress(void *ctx, uint64_t bytes)
{
	struct verify_count *v = ctx;

	if (v->p && v->p->fn)
		v->p->fn(v->p->ctx, v->base + bytes, v->total);
}

/* Verify one "files" entry of engine_state.json: the file `name` beneath
 * ckfd (the checkpoint `dir`), never through a symlink. */
static int verify_file(int ckfd, const char *dir, const char *name, json_t *info,
		       struct verify_count *vc, struct eng_error *err)
{
	json_t *jb = json_object_get(info, "bytes");
	const char *hex = json_string_value(json_object_get(info, "xxh64"));
	uint64_t want_xxh, got_xxh;
	struct stat sb;
	int fd, rc = 0;

	/* ckpt_state_parse checked the entry; this guards the I/O below. */
	if (!plain_name(name) || !json_is_integer(jb) || !ckpt_hex64(hex, &want_xxh))
		return eng_fail(err, -EBADMSG, "%s/%s: malformed files entry for '%s'", dir,
				STATE_FILE, name);
	fd = io_openat(ckfd, name, O_RDONLY, 0);
	if (fd == -ENOENT)
		return eng_fail(err, -EBADMSG, "%s/%s: listed in %s but missing", dir, name,
				STATE_FILE);
	if (fd < 0)
		return eng_fail(err, eng_errno_code(-fd), "%s/%s: cannot open: %s", dir, name,
				eng_errno_text(-fd));
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		rc = eng_fail(err, -EBADMSG, "%s/%s: listed in %s but not a regular file", dir,
			      name, STATE_FILE);
	} else if ((uint64_t)sb.st_size != (uint64_t)json_integer_value(jb)) {
		rc = eng_fail(err, -EBADMSG, "%s/%s: %lld bytes, %s records %lld", dir, name,
			      (long long)sb.st_size, STATE_FILE, (long long)json_integer_value(jb));
	} else {
		char *p = path_join(dir, name);

		rc = p ? fd_xxh64_progress(fd, p, verify_progress, vc, &got_xxh, err)
		       : eng_fail(err, -ENOMEM, "no memory");
		if (!rc && got_xxh != want_xxh)
			rc = eng_fail(err, -EBADMSG, "%s: XXH64 %016" PRIx64 " does not match "
				      "%016" PRIx64 " recorded in %s", p, got_xxh, want_xxh,
				      STATE_FILE);
		free(p);
	}
	close(fd);
	return rc;
}

/* The checkpoint named by <dir>/latest (dirfd): its name in *ret_name
 * (malloc'ed) and its descriptor in *ret_fd. Neither `latest` nor the entry
 * it names may be a symlink. */
static int follow_latest(int dirfd, const char *dir, char **ret_name, int *ret_fd,
			 struct eng_error *err)
{
	char *buf = NULL;
	size_t n = 0;
	int rc, fd;

	rc = io_read_file_at(dirfd, LATEST_FILE, NAME_MAX + 1, &buf, &n);
	if (rc == -ENOENT)
		return eng_fail(err, -ENOENT, "%s: neither %s nor %s found", dir, STATE_FILE,
				LATEST_FILE);
	if (rc == -EFBIG)
		return eng_fail(err, -EBADMSG, "%s/%s: does not hold a checkpoint name", dir,
				LATEST_FILE);
	if (rc < 0)
		return eng_fail(err, eng_errno_code(-rc), "%s/%s: cannot read: %s", dir,
				LATEST_FILE, eng_errno_text(-rc));
	while (n > 0 && isspace((unsigned char)buf[n - 1]))
		buf[--n] = '\0';
	if (!plain_name(buf) || strlen(buf) != n) {
		free(buf);
		return eng_fail(err, -EBADMSG, "%s/%s: does not hold a checkpoint name", dir,
				LATEST_FILE);
	}
	fd = io_openat(dirfd, buf, O_PATH | O_DIRECTORY, 0);
	if (fd == -ENOENT)
		rc = eng_fail(err, -ENOENT, "%s/%s/%s: does not exist (the checkpoint named by "
			      "%s)", dir, buf, STATE_FILE, LATEST_FILE);
	else if (fd == -ENOTDIR)
		rc = eng_fail(err, -EBADMSG, "%s/%s: named by %s, not a directory", dir, buf,
			      LATEST_FILE);
	else if (fd < 0)
		rc = eng_fail(err, eng_errno_code(-fd), "%s/%s (named by %s): %s", dir, buf,
			      LATEST_FILE, eng_errno_text(-fd));
	if (fd < 0) {
		free(buf);
		return rc;
	}
	*ret_name = buf;
	*ret_fd = fd;
	return 0;
}

int ckpt_open(const char *dir, json_t **ret_state, char **ret_dir, int *ret_fd,
	      struct eng_error *err)
{
	return ckpt_open_with(dir, NULL, ret_state, ret_dir, ret_fd, err);
}

int ckpt_open_with(const char *dir, const struct ckpt_open_opts *progress,
		       json_t **ret_state, char **ret_dir, int *ret_fd, struct eng_error *err)
{
	char *resolved = NULL, *sp = NULL, *name = NULL, *text = NULL;
	struct verify_count vc = { progress, 0, 0 };
	json_t *state = NULL, *info;
	int dirfd, ckfd = -1, rc;
	const char *fname;
	struct stat sb;
	size_t len = 0;

	/* `dir` as given (the daemon's pinned directory); below it nothing is
	 * reached through a symlink. */
	dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		rc = errno == ENOENT
		     ? eng_fail(err, -ENOENT, "%s: neither %s nor %s found", dir, STATE_FILE,
				LATEST_FILE)
		     : eng_fail(err, eng_errno_code(errno), "%s: %s", dir, strerror(errno));
		return rc;
	}
	if (fstatat(dirfd, STATE_FILE, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		resolved = strdup(dir);
		ckfd = dirfd;
		dirfd = -1;
		rc = resolved ? 0 : eng_fail(err, -ENOMEM, "%s: no memory", dir);
	} else {
		rc = follow_latest(dirfd, dir, &name, &ckfd, err);
		if (!rc) {
			resolved = path_join(dir, name);
			rc = resolved ? 0 : eng_fail(err, -ENOMEM, "%s: no memory", dir);
		}
	}
	if (rc)
		goto out;
	sp = path_join(resolved, STATE_FILE);
	if (!sp) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", dir);
		goto out;
	}
	rc = io_read_file_at(ckfd, STATE_FILE, STATE_MAX, &text, &len);
	if (rc == -EFBIG)
		rc = eng_fail(err, -EBADMSG, "%s: larger than %u bytes", sp, STATE_MAX);
	else if (rc < 0)
		rc = eng_fail(err, eng_errno_code(-rc), "%s: %s", sp, eng_errno_text(-rc));
	if (rc)
		goto out;
	rc = ckpt_state_parse(text, len, sp, &state, err);
	if (rc)
		goto out;
	/* For the progress only, capped at CKPT_PROGRESS_MAX (a crafted size
	 * skews it, nothing else: verify_file checks each size against its
	 * file). */
	json_object_foreach(json_object_get(state, "files"), fname, info) {
		uint64_t b = (uint64_t)json_integer_value(json_object_get(info, "bytes"));

		if (progress && progress->verify && !progress->verify(progress->ctx, state, fname))
			continue;
		vc.total = b > CKPT_PROGRESS_MAX - vc.total ? CKPT_PROGRESS_MAX : vc.total + b;
	}
	verify_progress(&vc, 0);
	json_object_foreach(json_object_get(state, "files"), fname, info) {
		if (progress && progress->verify && !progress->verify(progress->ctx, state, fname))
			continue;
		rc = verify_file(ckfd, resolved, fname, info, &vc, err);
		if (rc)
			goto out;
		vc.base += (uint64_t)json_integer_value(json_object_get(info, "bytes"));
		if (vc.base > vc.total)
			vc.base = vc.total;
	}
out:
	free(sp);
	free(name);
	free(text);
	if (dirfd >= 0)
		close(dirfd);
	if (rc) {
		if (ckfd >= 0)
			close(ckfd);
		json_decref(state);
		free(resolved);
		return rc;
	}
	*ret_state = state;
	if (ret_dir)
		*ret_dir = resolved;
	else
		free(resolved);
	if (ret_fd)
		*ret_fd = ckfd;
	else
		close(ckfd);
	return 0;
}
