/* adapters.h — the daemon's live LoRA adapters: name -> adapter engine
 * (engine_adapter_create: an engine of its own over the frozen base), in
 * the order they were created, with the bounds of [lora] max_adapters and
 * max_adapter_bytes (16 bytes per adapter parameter: weights, gradients,
 * two AdamW moments).
 *
 * Threads: the table is the engine thread's alone (it owns every engine);
 * what other threads see of it is the status snapshot the daemon copies out
 * under its lock (adapters_status, daemon.h).
 */
#ifndef ENGINED_DAEMON_ADAPTERS_H
#define ENGINED_DAEMON_ADAPTERS_H

#include <stdint.h>

#include "engine.h"
#include "err.h"

#define ADAPTER_BYTES_PER_PARAM 16

struct adapter {
	char name[ENGINE_ADAPTER_NAME_MAX + 1];
	struct engine *e;             /* owned */
	int64_t bytes;                /* ADAPTER_BYTES_PER_PARAM per parameter */
};

struct adapters {
	struct adapter *v;            /* [max], creation order */
	int n, max;
	int64_t bytes, max_bytes;     /* held by the live ones; the bound */
};

/* One adapter as GetStatus sees it (adapters_status). */
struct adapter_status {
	char name[ENGINE_ADAPTER_NAME_MAX + 1];
	struct engine_status st;
};

/* An empty table for at most max adapters of max_bytes in all; -ENOMEM. */
int adapters_init(struct adapters *t, int max, int64_t max_bytes);
/* Destroys every adapter (adapters_clear) and frees the table. */
void adapters_fini(struct adapters *t);

/* The adapter engine named `name`, or NULL. */
struct engine *adapters_find(const struct adapters *t, const char *name);

/* Whether an adapter named `name` may be created now: -EEXIST when the
 * name is in use, -E2BIG when max_adapters are live (err naming the bound,
 * its value and what the new one would make). */
int adapters_may_add(const struct adapters *t, const char *name, struct eng_error *err);

/* Add the adapter engine e under `name`, taking it over, when its bytes fit
 * max_adapter_bytes with the live ones; else -E2BIG (err naming the bound,
 * its value, what e needs and what is held) or adapters_may_add's error,
 * and e stays the caller's. */
int adapters_add(struct adapters *t, const char *name, struct engine *e,
		 struct eng_error *err);

/* Destroy the adapter `name`; -ENOENT (err naming `field`) when none. */
int adapters_delete(struct adapters *t, const char *name, const char *field,
		    struct eng_error *err);

/* Destroy every adapter, newest first (before their base is destroyed). */
void adapters_clear(struct adapters *t);

/* The live adapters' names and status, in creation order, into ret (room
 * for t->max); returns how many. */
int adapters_status(const struct adapters *t, struct adapter_status *ret);

#endif
