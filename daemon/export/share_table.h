/* share_table.h — ShareWeights' pending shares: sealed memfds waiting to be
 * picked up over the share socket, each under a random 128-bit handle
 * (getrandom), good for `uses` pick-ups until it expires ([server]
 * share_ttl_s after it was made). The table owns each file descriptor until
 * its last pick-up or its expiry, when it closes it.
 *
 * Bounded: at most max_shares entries and max_bytes of shared memory
 * pending at once; share_table_admit is the one admission rule (-E2BIG,
 * RESOURCE_EXHAUSTED, naming the bound), applied again by share_table_add.
 * Handles are secrets: the log and the counters name a share by its id
 * (1, 2, ... in the order made), never by its handle, and a lookup compares
 * every entry in constant time.
 *
 * Time is passed in (milliseconds of CLOCK_MONOTONIC: share_table_now_ms)
 * so that tests drive expiry. Threads: any; every call takes the table's
 * lock.
 */
#ifndef ENGINED_DAEMON_SHARE_TABLE_H
#define ENGINED_DAEMON_SHARE_TABLE_H

#include <stdint.h>

#include "err.h"

#define SHARE_HANDLE_BYTES 16
#define SHARE_MAX_USES 1024

struct share_limits {
	int max_shares;               /* entries pending at once, >= 1 */
	int64_t max_bytes;            /* their bytes, >= 1 */
	int64_t ttl_ms;               /* lifetime of a handle, >= 1 */
};

/* One share as a pick-up or the sweep sees it. */
struct share_info {
	uint64_t id;
	int64_t bytes;
	int uses, uses_left;          /* after this pick-up */
};

struct share_table;

/* -ENOMEM. */
int share_table_new(const struct share_limits *l, struct share_table **ret);
/* Closes every pending descriptor. Accepts NULL. */
void share_table_free(struct share_table *t);

int64_t share_table_now_ms(void);
int64_t share_table_ttl_ms(const struct share_table *t);

/* Whether a share of `bytes` would be taken now (expired entries are swept
 * first): 0, or -E2BIG naming server.max_shares or server.max_share_bytes. */
int share_table_admit(struct share_table *t, int64_t bytes, int64_t now_ms,
		      struct eng_error *err);

/* Keep fd (the table owns it from now on, also when this fails: then it is
 * closed) for `uses` pick-ups (1..SHARE_MAX_USES) under a fresh handle,
 * written into `handle`; *ret_id: the share's id. -E2BIG (admit's rule),
 * -EINVAL (uses), -EIO (no random bytes). */
int share_table_add(struct share_table *t, int fd, int64_t bytes, int uses, int64_t now_ms,
		    uint8_t handle[SHARE_HANDLE_BYTES], uint64_t *ret_id,
		    struct eng_error *err);

/* One pick-up of `handle`: a descriptor of the share's file that the
 * caller owns (the table's own at the last use, which removes the entry;
 * a duplicate before), or -ENOENT (unknown, used up or expired: an expired
 * entry is removed), -EMFILE (no descriptor for the duplicate; the use is
 * not spent). */
int share_table_take(struct share_table *t, const uint8_t handle[SHARE_HANDLE_BYTES],
		     int64_t now_ms, struct share_info *ret);

/* Close the shares whose expiry has come (each logged). Returns how many;
 * *ret_next_ms (may be NULL): milliseconds until the next expiry, -1 when
 * nothing is pending. */
int share_table_sweep(struct share_table *t, int64_t now_ms, int64_t *ret_next_ms);

/* Shares pending and their bytes. */
void share_table_counts(struct share_table *t, int *ret_n, int64_t *ret_bytes);

#endif
