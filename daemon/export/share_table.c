/* share_table.c — ShareWeights' pending shares (see share_table.h). */
#include "share_table.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

struct share_entry {
	bool live;
	uint8_t handle[SHARE_HANDLE_BYTES];
	int fd;
	int64_t bytes;
	int uses, uses_left;
	int64_t expires_ms;
	uint64_t id;
};

struct share_table {
	pthread_mutex_t lock;
	struct share_limits lim;
	struct share_entry *e;        /* [lim.max_shares] */
	int n;                        /* live entries */
	int64_t bytes;                /* of the live entries */
	uint64_t next_id;
};

int share_table_new(const struct share_limits *l, struct share_table **ret)
{
	struct share_table *t;

	if (l->max_shares < 1 || l->max_bytes < 1 || l->ttl_ms < 1)
		return -EINVAL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->e = calloc((size_t)l->max_shares, sizeof(*t->e));
	if (!t->e) {
		free(t);
		return -ENOMEM;
	}
	pthread_mutex_init(&t->lock, NULL);
	t->lim = *l;
	t->next_id = 1;
	*ret = t;
	return 0;
}

void share_table_free(struct share_table *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->lim.max_shares; i++)
		if (t->e[i].live)
			close(t->e[i].fd);
	pthread_mutex_destroy(&t->lock);
	free(t->e);
	free(t);
}

int64_t share_table_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t share_table_ttl_ms(const struct share_table *t)
{
	return t->lim.ttl_ms;
}

/* Lock held: drop entry x, closing its descriptor unless `keep_fd`. */
static void drop_locked(struct share_table *t, struct share_entry *x, bool keep_fd)
{
	if (!keep_fd)
		close(x->fd);
	t->n--;
	t->bytes -= x->bytes;
	memset(x, 0, sizeof(*x));
}

static int sweep_locked(struct share_table *t, int64_t now_ms, int64_t *ret_next_ms)
{
	int64_t next = -1;
	int swept = 0;

	for (int i = 0; i < t->lim.max_shares; i++) {
		struct share_entry *x = &t->e[i];

		if (!x->live)
			continue;
		if (now_ms >= x->expires_ms) {
			if (x->uses_left == x->uses)
				log_msg(LOG_LVL_WARN,
					"share #%llu expired unclaimed after %.1f s (%lld bytes freed)",
					(unsigned long long)x->id, (double)t->lim.ttl_ms / 1e3,
					(long long)x->bytes);
			else
				log_msg(LOG_LVL_INFO,
					"share #%llu expired after %d of its %d uses (%lld bytes)",
					(unsigned long long)x->id, x->uses - x->uses_left, x->uses,
					(long long)x->bytes);
			drop_locked(t, x, false);
			swept++;
			continue;
		}
		if (next < 0 || x->expires_ms - now_ms < next)
			next = x->expires_ms - now_ms;
	}
	if (ret_next_ms)
		*ret_next_ms = next;
	return swept;
}

int share_table_sweep(struct share_table *t, int64_t now_ms, int64_t *ret_next_ms)
{
	int r;

	pthread_mutex_lock(&t->lock);
	r = sweep_locked(t, now_ms, ret_next_ms);
	pthread_mutex_unlock(&t->lock);
	return r;
}

/* The one admission rule; lock held. */
static int admit_locked(struct share_table *t, int64_t bytes, int64_t now_ms,
			struct eng_error *err)
{
	sweep_locked(t, now_ms, NULL);
	if (t->n >= t->lim.max_shares)
		return eng_fail(err, -E2BIG,
				"share: %d shares are waiting to be picked up (server.max_shares = %d); "
				"pick them up or let them expire (server.share_ttl_s = %.1f s)",
				t->n, t->lim.max_shares, (double)t->lim.ttl_ms / 1e3);
	if (bytes > t->lim.max_bytes - t->bytes)
		return eng_fail(err, -E2BIG,
				"share: %lld bytes with %lld bytes of shares waiting to be picked up "
				"would pass server.max_share_bytes = %lld",
				(long long)bytes, (long long)t->bytes, (long long)t->lim.max_bytes);
	return 0;
}

int share_table_admit(struct share_table *t, int64_t bytes, int64_t now_ms,
		      struct eng_error *err)
{
	int r;

	pthread_mutex_lock(&t->lock);
	r = admit_locked(t, bytes, now_ms, err);
	pthread_mutex_unlock(&t->lock);
	return r;
}

int share_table_add(struct share_table *t, int fd, int64_t bytes, int uses, int64_t now_ms,
		    uint8_t handle[SHARE_HANDLE_BYTES], uint64_t *ret_id,
		    struct eng_error *err)
{
	struct share_entry *x = NULL;
	int r;

	if (uses < 1 || uses > SHARE_MAX_USES) {
		close(fd);
		return eng_fail(err, -EINVAL, "uses: %d not in [1, %d]", uses, SHARE_MAX_USES);
	}
	if (getrandom(handle, SHARE_HANDLE_BYTES, 0) != SHARE_HANDLE_BYTES) {
		close(fd);
		return eng_fail(err, -EIO, "share: no random bytes for a handle (getrandom)");
	}
	pthread_mutex_lock(&t->lock);
	r = admit_locked(t, bytes, now_ms, err);
	for (int i = 0; r == 0 && i < t->lim.max_shares && !x; i++)
		if (!t->e[i].live)
			x = &t->e[i];
	if (r == 0 && !x)
		r = eng_fail(err, -EIO, "share: no free entry below server.max_shares");
	if (r < 0) {
		pthread_mutex_unlock(&t->lock);
		close(fd);
		return r;
	}
	x->live = true;
	memcpy(x->handle, handle, SHARE_HANDLE_BYTES);
	x->fd = fd;
	x->bytes = bytes;
	x->uses = x->uses_left = uses;
	x->expires_ms = now_ms + t->lim.ttl_ms;
	x->id = t->next_id++;
	t->n++;
	t->bytes += bytes;
	*ret_id = x->id;
	pthread_mutex_unlock(&t->lock);
	return 0;
}

int share_table_take(struct share_table *t, const uint8_t handle[SHARE_HANDLE_BYTES],
		     int64_t now_ms, struct share_info *ret)
{
	struct share_entry *x = NULL;
	int fd;

	pthread_mutex_lock(&t->lock);
	/* Every live entry compared whole: the time does not tell how much of
	 * a guess matched. */
	for (int i = 0; i < t->lim.max_shares; i++) {
		unsigned diff = 0;

		for (int k = 0; k < SHARE_HANDLE_BYTES; k++)
			diff |= (unsigned)(t->e[i].handle[k] ^ handle[k]);
		if (t->e[i].live && diff == 0)
			x = &t->e[i];
	}
	if (!x || now_ms >= x->expires_ms) {
		sweep_locked(t, now_ms, NULL);
		pthread_mutex_unlock(&t->lock);
		return -ENOENT;
	}
	if (x->uses_left > 1) {
		fd = fcntl(x->fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0) {
			pthread_mutex_unlock(&t->lock);
			return -EMFILE;
		}
		x->uses_left--;
	} else {
		fd = x->fd;
		x->uses_left = 0;
	}
	ret->id = x->id;
	ret->bytes = x->bytes;
	ret->uses = x->uses;
	ret->uses_left = x->uses_left;
	if (x->uses_left == 0)
		drop_locked(t, x, true);
	pthread_mutex_unlock(&t->lock);
	return fd;
}

void share_table_counts(struct share_table *t, int *ret_n, int64_t *ret_bytes)
{
	pthread_mutex_lock(&t->lock);
	*ret_n = t->n;
	*ret_bytes = t->bytes;
	pthread_mutex_unlock(&t->lock);
}
