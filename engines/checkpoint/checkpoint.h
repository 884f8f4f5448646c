/* checkpoint.h — checkpoint directories under a root (docs/DESIGN.md §6).
 *
 * Layout of one checkpoint `<root>/<name>/`:
 *   config.json            HF config (model)
 *   model.safetensors      parameters in HF names (model)
 *   optimizer.safetensors  "exp_avg.<name>", "exp_avg_sq.<name>" (optimizer,
 *                          one engine), or a group's shards
 *                          optimizer-<r>-of-<W>.safetensors (one per rank:
 *                          engines/native/native_optim_files.c)
 *   engine_state.json      format version, step, scheduler, RNG, optimizer
 *                          hyper-parameters, engine key, world size,
 *                          contents, per-file sizes and XXH64 checksums
 * and `<parent>/latest` holds the name of the newest checkpoint.
 *
 * Symlinks: `dir` (and the parent of a checkpoint being written) is taken
 * as the caller names it; below it nothing is opened, written, read or
 * removed through a symlink (engines/include/io/fileio.h, io_openat): `latest`,
 * the entry it names, every file of a checkpoint. A symlink there is
 * -EPERM naming it; a symlink in the parent is never a checkpoint (not
 * rotated, not followed when removing).
 *
 * Writing: files go to `<parent>/.<name>.tmp-<pid>/`, each fsync'ed, the
 * directory is fsync'ed and renamed over `<name>` (an existing one is
 * swapped out atomically with renameat2(RENAME_EXCHANGE) and removed after
 * the swap), the parent fsync'ed, then `latest` is replaced atomically
 * (write temp + fsync + rename). A crash at any point leaves the previous
 * checkpoint and `latest` intact. Temporary entries of dead writers
 * (`.<name>.tmp-<pid>`, `.<name>.del-<pid>`) are ignored by ckpt_open and
 * rotation and removed by the next ckpt_writer_begin in the same parent.
 * Rotation: after a save, checkpoints in the parent that carry a valid
 * engine_state.json with an integer "global_step" are ordered by it; the
 * one just written and the newest max_to_keep - 1 others are kept, the rest
 * removed. Derived from the disk only.
 *
 * engine_state.json holds the caller's members and three of this
 * library's: "format_version" (CKPT_FORMAT_VERSION), "files" (each file
 * name -> {"bytes": n, "xxh64": "<16 lowercase hex digits>"}) and
 * "state_xxh64", the XXH64 of the file's canonical form without it (see
 * ckpt_state.c): any change to a value, a key or the structure fails the
 * check (-EBADMSG naming the file and key); whitespace is not covered
 * (parsing ignores it). Older files without a checksum (format_version
 * 1) are refused with -EINVAL saying so.
 */
#ifndef ENGINED_CHECKPOINT_H
#define ENGINED_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"

#define CKPT_FORMAT_VERSION 2

struct ckpt_writer;

/* Begin writing checkpoint directory `dir` (absolute; its parent must
 * exist). Returns the temporary directory in which files are to be created
 * via ckpt_writer_path(). */
int ckpt_writer_begin(const char *dir, struct ckpt_writer **ret, struct eng_error *err);
/* Path of file `name` inside the temporary directory (static per writer,
 * valid until the next call; NULL only if `name` is longer than NAME_MAX
 * and memory runs out), for messages. Another writer of the same directory
 * in this process makes ckpt_writer_begin fail with -EALREADY. */
const char *ckpt_writer_path(struct ckpt_writer *w, const char *name);
/* Descriptor of the temporary directory (owned by the writer): files are
 * created beneath it with io_openat / st_writer_new_at, never by path. */
int ckpt_writer_dirfd(const struct ckpt_writer *w);
/* The temporary directory's name in the parent (".<name>.tmp-<pid>"):
 * the other ranks of a group write their files into it (ckpt_join_temp). */
const char *ckpt_writer_temp_name(const struct ckpt_writer *w);
/* Open the temporary directory `tmpname` of another process's writer of
 * checkpoint `dir` (absolute; its parent as given, tmpname beneath it
 * never through a symlink): *ret_fd, to create files in with
 * st_writer_new_at; that writer records them (ckpt_writer_record checks
 * that each is there with its size). A name that is not the temporary
 * name of `dir`'s last component: -EINVAL; a missing one: -ENOENT. */
int ckpt_join_temp(const char *dir, const char *tmpname, int *ret_fd, struct eng_error *err);
/* Record a written file (its bytes and xxh64) for engine_state.json. The
 * file must already be fsync'ed. */
int ckpt_writer_record(struct ckpt_writer *w, const char *name, uint64_t bytes,
		       uint64_t xxh64, struct eng_error *err);
/* Write a small file (config.json) with fsync and record it. */
int ckpt_writer_put(struct ckpt_writer *w, const char *name, const void *data,
		    size_t len, struct eng_error *err);
/* Write engine_state.json from `state_json` (a jansson object, borrowed)
 * with a "files" member added, fsync, rename into place, update `latest`,
 * rotate to max_to_keep (<= 0: keep all). Frees the writer either way;
 * on failure the temporary directory is removed. ret_bytes: total bytes. */
int ckpt_writer_commit(struct ckpt_writer *w, json_t *state_json, int max_to_keep,
		       uint64_t *ret_bytes, struct eng_error *err);
void ckpt_writer_abort(struct ckpt_writer *w);   /* accepts NULL */

/* Open a checkpoint for reading: `dir` itself, or when `dir` has a `latest`
 * file and no engine_state.json, the checkpoint it names. Parses
 * engine_state.json (returned as a new jansson object reference in
 * *ret_state, caller decrefs) and verifies every listed file's size and
 * XXH64: a mismatch is -EBADMSG naming the file; a missing file -ENOENT (a
 * listed one missing: -EBADMSG). *ret_dir (malloc'ed; may be NULL) is the
 * resolved checkpoint directory, for messages; *ret_fd (may be NULL) an
 * O_PATH descriptor of it (caller closes) to open its files beneath. */
int ckpt_open(const char *dir, json_t **ret_state, char **ret_dir, int *ret_fd,
	      struct eng_error *err);
/* ckpt_open with options (NULL members: the defaults):
 *   fn(ctx, done, total): the verification's progress, the bytes of the
 *     verified files hashed so far of all of them, from 0 (once
 *     engine_state.json is parsed) to total (at most CKPT_PROGRESS_MAX);
 *   verify(ctx, state, name): whether to verify listed file `name` (a
 *     reader that reads only some files of a checkpoint checks those;
 *     default: every file). */
#define CKPT_PROGRESS_MAX ((uint64_t)INT64_MAX / 4)
struct ckpt_open_opts {
	void (*fn)(void *ctx, uint64_t done, uint64_t total);
	void *ctx;
	bool (*verify)(void *ctx, json_t *state, const char *name);
};
int ckpt_open_with(const char *dir, const struct ckpt_open_opts *opts, json_t **ret_state,
		   char **ret_dir, int *ret_fd, struct eng_error *err);

/* --- engine_state.json's seal (ckpt_state.c) --- */

/* "format_version", "files", "state_xxh64": members the library writes;
 * a caller's state must not hold them (commit: -EINVAL). */
bool ckpt_reserved_key(const char *key);
/* s is 16 lowercase hex digits (*ret: their value; ret may be NULL). */
bool ckpt_hex64(const char *s, uint64_t *ret);
/* Set format_version and state_xxh64 (over the canonical form of the rest). */
int ckpt_state_seal(json_t *state, struct eng_error *err);
/* Parse engine_state.json's text (`shown` in messages) and check the seal
 * and the library's members: invalid JSON, a missing or wrong checksum, a
 * malformed "files" entry or unknown key in one: -EBADMSG; another
 * format_version: -EINVAL. *ret: a new reference. */
int ckpt_state_parse(const char *text, size_t len, const char *shown, json_t **ret,
		     struct eng_error *err);

#endif
