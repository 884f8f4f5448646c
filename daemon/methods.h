/* methods.h — the method table: every RPC the daemon serves, with its
 * policy (where it runs, the token it needs, the state it needs) and its
 * handlers. Paths and request types come from protobuf-c's generated
 * service descriptors (methods_init). */
#ifndef ENGINED_DAEMON_METHODS_H
#define ENGINED_DAEMON_METHODS_H

#include "job.h"

extern struct method daemon_methods[];
extern const int daemon_n_methods;
/* By row, filled by methods_init: the paths ("/pkg.Service/Method") and
 * the labels of logs and metrics. */
extern const char *daemon_method_paths[];
extern const char *daemon_method_labels[];

/* Fill every row from its service descriptor (idempotent). -EINVAL naming
 * the row when a method is not in its service: a build mistake. */
int methods_init(struct eng_error *err);

#endif
