/* err.h — error convention of the engine library.
 *
 * Library functions return 0 (or a non-negative count) on success and a
 * negative errno-style code on failure. When the caller passes a
 * `struct eng_error *`, the failing function also writes a message that
 * names the offending field ("seq_lens[3]: sequence of 9000 tokens exceeds
 * max_tokens_per_micro_batch 4096"). The library never logs.
 *
 * ENG_ERROR_CODES is the one list of the codes that the engine library and
 * the daemon return, with the gRPC status the daemon answers for each:
 * eng_strerror names them, the daemon's job_rpc_code maps them, and
 * tests/unit/test_err.c and test_daemon_codes.c iterate them. A code not in
 * the list is a bug; the daemon answers it INTERNAL.
 */
#ifndef ENGINED_ERR_H
#define ENGINED_ERR_H

#include <errno.h>
#include <stdarg.h>

#define ENG_ERROR_MSG_MAX 512

/* X(errno name, gRPC status, meaning) */
#define ENG_ERROR_CODES(X) \
	X(EINVAL, INVALID_ARGUMENT, "a request field is malformed or out of range (the message names it)") \
	X(ENOENT, NOT_FOUND, "a file, checkpoint, directory, tensor or LoRA adapter that does not exist") \
	X(ENOMEM, RESOURCE_EXHAUSTED, "memory for the call could not be reserved; the engine stays usable") \
	X(E2BIG, RESOURCE_EXHAUSTED, "over a configured limit (request size, concurrent calls, reply size, LoRA adapters' number or bytes, a Sample's key/value cache)") \
	X(ENOSPC, RESOURCE_EXHAUSTED, "no space left on the file system (or over a disk quota), or a device resource ran out (e.g. shared memory for a kernel); the message names the path") \
	X(EMFILE, RESOURCE_EXHAUSTED, "out of file descriptors (the daemon's or the system's limit)") \
	X(EEXIST, ALREADY_EXISTS, "a request id that was already applied, its reply no longer kept; an adapter name already in use") \
	X(EPERM, PERMISSION_DENIED, "a path escapes its root, a file in a checkpoint or model directory is a symlink, file permissions refuse, a read-only token asked for a change, or a token limited to adapters named another adapter or the base model") \
	X(EACCES, PERMISSION_DENIED, "no valid credentials (the daemon answers UNAUTHENTICATED for a missing or unknown token)") \
	X(EBADMSG, DATA_LOSS, "a corrupt or inconsistent file or checkpoint") \
	X(ENODEV, FAILED_PRECONDITION, "device or engine not built or registered") \
	X(ELIBACC, FAILED_PRECONDITION, "a device library (e.g. cuBLASLt) is missing") \
	X(EALREADY, FAILED_PRECONDITION, "wrong state: not initialized, wrong mode, state on the host, a read-only file system under a root") \
	X(ECANCELED, CANCELLED, "the client cancelled the call") \
	X(ETIMEDOUT, DEADLINE_EXCEEDED, "the call's deadline passed before it ran, or a collective of the data-parallel group did not complete in time (a rank did not arrive)") \
	X(ENOSYS, UNIMPLEMENTED, "a service or method this daemon does not provide") \
	X(ESHUTDOWN, UNAVAILABLE, "the daemon is shutting down") \
	X(ECONNRESET, UNAVAILABLE, "a peer of the data-parallel group closed its connection (a rank died)") \
	X(ENOTCONN, FAILED_PRECONDITION, "the data-parallel group was broken by an earlier failure: Initialize again (replace) to re-form it") \
	X(EIO, INTERNAL, "an I/O error or a device failure")

/* One row of ENG_ERROR_CODES. */
struct eng_code {
	int code;             /* negative errno */
	const char *name;     /* "EINVAL" */
	const char *status;   /* "INVALID_ARGUMENT" */
	const char *meaning;
};
extern const struct eng_code eng_codes[];
extern const int eng_n_codes;

struct eng_error {
	int code;                     /* negative errno, 0 = none */
	char msg[ENG_ERROR_MSG_MAX];  /* names the field; NUL-terminated */
};

/* Record `code` and a printf-style message in `err` (may be NULL) and
 * return `code`, so that callers can write `return eng_fail(err, -EINVAL, ...)`.
 * A second failure does not overwrite the first message. */
int eng_fail(struct eng_error *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Clear `err` (may be NULL). */
void eng_error_clear(struct eng_error *err);

/* Short name of an error code ("EINVAL"; "OK" for 0), for logs and tests;
 * "E?" for a code not in ENG_ERROR_CODES. */
const char *eng_strerror(int code);

/* The library code for an errno e (positive) from a file-system call; the
 * one mapping every file-system error path uses:
 *   ENOENT                        -> -ENOENT    NOT_FOUND
 *   ENOMEM                        -> -ENOMEM    RESOURCE_EXHAUSTED
 *   ENOSPC, EDQUOT, EFBIG         -> -ENOSPC    RESOURCE_EXHAUSTED (disk full,
 *                                               quota, file too large)
 *   EMFILE, ENFILE                -> -EMFILE    RESOURCE_EXHAUSTED
 *   EACCES, EPERM                 -> -EPERM     PERMISSION_DENIED
 *   ELOOP, EXDEV                  -> -EPERM     PERMISSION_DENIED (a symlink
 *                                               refused, a path leaving its
 *                                               directory: io_openat)
 *   EROFS                         -> -EALREADY  FAILED_PRECONDITION (a
 *                                               read-only root is the
 *                                               deployment's state, not the
 *                                               caller's permission)
 *   ENAMETOOLONG, ENOTDIR, EISDIR -> -EINVAL    INVALID_ARGUMENT (the name
 *                                               the client gave)
 *   anything else (EIO, ...)      -> -EIO       INTERNAL */
int eng_errno_code(int e);

/* Text for errno e in messages: strerror(e), except ELOOP ("a symlink,
 * refused") and EXDEV ("outside its directory, refused"), the refusals of
 * io_openat. */
const char *eng_errno_text(int e);

#endif
