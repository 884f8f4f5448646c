/* xxh.c — XXH64 checksum of a whole file (safetensors.h), used to verify
 * checkpoint files. Streams the file with large reads so that a multi-GB
 * checkpoint is hashed at disk speed with two bounded buffers: a reader
 * thread fills one while the other is hashed (xxh_pipe). A file of
 * XXH_AHEAD_MIN or more has its second half pulled into the page cache by
 * readahead(2) on a third thread meanwhile (xxh_ahead): disks read two
 * streams faster than one (this VM's: 2.4x, docs/PERF.md), and what the
 * hash reads next is then in memory, as is what a checkpoint load reads
 * after verifying.
 */
#include "io/safetensors.h"
#include "io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define XXH_READ_CHUNK (8u << 20)
#define XXH_AHEAD_MIN (64 << 20)

int file_xxh64(const char *path, uint64_t *ret, struct eng_error *err)
{
	int fd = io_open_file(path, O_RDONLY, 0), r;

	if (fd < 0)
		return eng_fail(err, eng_errno_code(-fd), "%s: cannot open: %s", path,
				eng_errno_text(-fd));
	r = fd_xxh64(fd, path, ret, err);
	close(fd);
	return r;
}

int fd_xxh64(int fd, const char *path, uint64_t *ret, struct eng_error *err)
{
	return fd_xxh64_progress(fd, path, NULL, NULL, ret, err);
}

/* The reading half of fd_xxh64_progress: a thread that reads chunk k+1
 * into the other buffer while chunk k is hashed, so the disk never waits
 * for the hash (the time is the larger of the two, not their sum). */
struct xxh_pipe {
	int fd;
	char *buf[2];
	ssize_t len[2];         /* bytes in buf[i]; 0 at the end; < 0: -errno */
	bool full[2];
	bool stop;
	pthread_mutex_t lock;
	pthread_cond_t cond;
};

static void *xxh_reader(void *arg)
{
	struct xxh_pipe *p = arg;
	off_t off = 0;

	for (int k = 0;; k ^= 1) {
		ssize_t n;

		pthread_mutex_lock(&p->lock);
		while (p->full[k] && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		pthread_mutex_unlock(&p->lock);
		if (p->stop)
			return NULL;
		do
			n = pread(p->fd, p->buf[k], XXH_READ_CHUNK, off);
		while (n < 0 && errno == EINTR);
		pthread_mutex_lock(&p->lock);
		p->len[k] = n < 0 ? -errno : n;
		p->full[k] = true;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		if (n <= 0)
			return NULL;
		off += n;
	}
}

/* The second reader: readahead(2) of [from, to) in chunks (no copy: the
 * pages only enter the cache), stopping early when told. Advisory: a
 * failure or evicted pages cost time, never correctness. */
struct xxh_ahead {
	int fd;
	off_t from, to;
	bool stop;                      /* atomic */
};

static void *xxh_ahead_main(void *arg)
{
	struct xxh_ahead *a = arg;

	for (off_t off = a->from; off < a->to && !__atomic_load_n(&a->stop, __ATOMIC_RELAXED);
	     off += XXH_READ_CHUNK) {
		size_t len = a->to - off < XXH_READ_CHUNK ? (size_t)(a->to - off) : XXH_READ_CHUNK;

		if (readahead(a->fd, off, len) < 0)
			break;
	}
	return NULL;
}

int fd_xxh64_progress(int fd, const char *path, void (*fn)(void *ctx, uint64_t bytes),
		      void *ctx, uint64_t *ret, struct eng_error *err)
{
	struct xxh_pipe p = { .fd = fd };
	struct xxh_ahead ahead = { .fd = fd };
	XXH64_state_t *st = NULL;
	pthread_t reader, ahead_th;
	bool started = false, ahead_started = false;
	uint64_t done = 0;
	struct stat sb;
	int r = 0;

	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	pthread_mutex_init(&p.lock, NULL);
	pthread_cond_init(&p.cond, NULL);
	p.buf[0] = malloc(XXH_READ_CHUNK);
	p.buf[1] = malloc(XXH_READ_CHUNK);
	st = XXH64_createState();
	if (!p.buf[0] || !p.buf[1] || !st) {
		r = eng_fail(err, -ENOMEM, "%s: no memory for the checksum buffers", path);
		goto out;
	}
	XXH64_reset(st, 0);
	if (pthread_create(&reader, NULL, xxh_reader, &p) != 0) {
		r = eng_fail(err, -EAGAIN, "%s: cannot start the checksum reader", path);
		goto out;
	}
	started = true;
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size >= XXH_AHEAD_MIN) {
		ahead.from = sb.st_size / 2 / XXH_READ_CHUNK * XXH_READ_CHUNK;
		ahead.to = sb.st_size;
		ahead_started = pthread_create(&ahead_th, NULL, xxh_ahead_main, &ahead) == 0;
	}
	for (int k = 0;; k ^= 1) {
		ssize_t n;

		pthread_mutex_lock(&p.lock);
		while (!p.full[k])
			pthread_cond_wait(&p.cond, &p.lock);
		n = p.len[k];
		pthread_mutex_unlock(&p.lock);
		if (n < 0) {
			r = eng_fail(err, eng_errno_code((int)-n), "%s: read: %s", path,
				     strerror((int)-n));
			break;
		}
		if (n == 0)
			break;
		XXH64_update(st, p.buf[k], (size_t)n);
		done += (uint64_t)n;
		pthread_mutex_lock(&p.lock);
		p.full[k] = false;
		pthread_cond_broadcast(&p.cond);
		pthread_mutex_unlock(&p.lock);
		if (fn)
			fn(ctx, done);
	}
	if (r == 0)
		*ret = XXH64_digest(st);
out:
	if (ahead_started) {
		__atomic_store_n(&ahead.stop, true, __ATOMIC_RELAXED);
		pthread_join(ahead_th, NULL);
	}
	if (started) {
		pthread_mutex_lock(&p.lock);
		p.stop = true;
		pthread_cond_broadcast(&p.cond);
		pthread_mutex_unlock(&p.lock);
		pthread_join(reader, NULL);
	}
	pthread_cond_destroy(&p.cond);
	pthread_mutex_destroy(&p.lock);
	XXH64_freeState(st);
	free(p.buf[0]);
	free(p.buf[1]);
	return r;
}
