/* paths.h — confinement of client-supplied paths under a configured root.
 *
 * A client names checkpoints and models by paths relative to the daemon's
 * roots. Refused with -EPERM (PERMISSION_DENIED): absolute paths, any ".."
 * component, and paths whose existing part resolves (through symlinks,
 * including dangling ones) outside the root.
 */
#ifndef ENGINED_DAEMON_PATHS_H
#define ENGINED_DAEMON_PATHS_H

#include <stdbool.h>

#include "err.h"

/* Resolve `rel` (the request field `field`) under `root_real`, an absolute
 * path without symlinks (see paths_prepare_root). On success *ret_abs is a
 * malloc'ed absolute path (caller frees). must_exist: -ENOENT naming the
 * field when the path does not exist. */
int path_confine(const char *root_real, const char *rel, const char *field,
		 bool must_exist, char **ret_abs, struct eng_error *err);

/* Create `dir` (and parents) if missing, then return its realpath
 * (malloc'ed) in *ret. */
int paths_prepare_root(const char *dir, char **ret, struct eng_error *err);

/* mkdir -p of the parent directories of abs (already confined). */
int paths_make_parents(const char *abs, struct eng_error *err);

/* Clean a relative path: drop "." components and repeated slashes.
 * Returns a malloc'ed string or NULL (ENOMEM). */
char *paths_normalize(const char *rel);

#endif
