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

/* A location pinned beneath a root: `fd` is an O_PATH descriptor of a
 * directory that the kernel resolved beneath the root (openat2 with
 * RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS: no "..", no absolute symlink,
 * no symlink leading out), and `path` names the target through that
 * descriptor ("/proc/self/fd/7/name" or "/proc/self/fd/7"). Code that
 * takes paths (the checkpoint writer, the model loader) opens everything
 * through the pinned directory, so renaming or swapping a component for a
 * symlink after the check cannot redirect it out of the root. Symlinks
 * that stay inside the root are followed up to the pinned directory; below
 * it the engine follows none (engines/include/io/fileio.h: io_openat): a symlinked
 * file in a checkpoint or model directory, `latest` or the entry it names
 * is -EPERM naming the file. */
struct paths_pin {
	int fd;                 /* -1: none */
	char path[64 + 256];
	char shown[512];        /* the relative path, for messages */
};

enum paths_pin_mode {
	PIN_DIR,                /* `rel` is an existing directory: pin it */
	PIN_PARENT_CREATE,      /* pin rel's parent (created as needed); rel's
				 * last component is a name inside it that
				 * must not be a symlink */
};

/* Refusals as path_confine (-EPERM naming `field`), -ENOENT for a missing
 * PIN_DIR target, -ENOTDIR when a component is not a directory. On
 * success fill *ret (release with paths_unpin). */
int paths_pin(const char *root_real, const char *rel, const char *field,
	      enum paths_pin_mode mode, struct paths_pin *ret, struct eng_error *err);
void paths_unpin(struct paths_pin *p);
/* The outcome r of code that was handed p->path, as the client sees it:
 * when the pinned directory was removed (or replaced by a rename) while
 * that code ran, -ENOENT saying so (a save or load racing a directory swap
 * answers NOT_FOUND; nothing was written outside the root); otherwise r,
 * with "/proc/self/fd/N" in err->msg replaced by the relative path. */
int paths_pin_result(const struct paths_pin *p, int r, struct eng_error *err);

/* Create `dir` (and parents) if missing, then return its realpath
 * (malloc'ed) in *ret. */
int paths_prepare_root(const char *dir, char **ret, struct eng_error *err);

/* mkdir -p of the parent directories of abs (already confined). */
int paths_make_parents(const char *abs, struct eng_error *err);

/* Clean a relative path: drop "." components and repeated slashes.
 * Returns a malloc'ed string or NULL (ENOMEM). */
char *paths_normalize(const char *rel);

#endif
