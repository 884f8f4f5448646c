/* lifecycle.h — start and stop a daemon (lifecycle.c): what main.c calls. */
#ifndef ENGINED_DAEMON_LIFECYCLE_H
#define ENGINED_DAEMON_LIFECYCLE_H

#include "daemon.h"

int daemon_init(struct daemon *d, const struct daemon_config *cfg,
		char *errbuf, size_t errlen);
/* Start serving: the engine thread, then the gRPC server. */
int daemon_start(struct daemon *d, char *errbuf, size_t errlen);
/* Graceful stop: refuse new calls with UNAVAILABLE, let the running job
 * finish (and save_on_stop), answer queued jobs UNAVAILABLE, stop the
 * server. Blocks up to cfg.grace_ms for the engine thread; returns
 * -ETIMEDOUT when it is still running then (the process must exit without
 * freeing what that thread uses), else 0. */
int daemon_stop(struct daemon *d);
/* SIGHUP: re-read the token file and the TLS files. The old ones stay in
 * force when the new ones are bad. Returns 0 or the first error. */
int daemon_reload(struct daemon *d, struct eng_error *err);
/* False once the daemon is stopping or its device failed (health). */
bool daemon_serving(struct daemon *d);
void daemon_fini(struct daemon *d);

#endif
