/* err.h — error convention of the engine library.
 *
 * Library functions return 0 (or a non-negative count) on success and a
 * negative errno-style code on failure. When the caller passes a
 * `struct eng_error *`, the failing function also writes a message that
 * names the offending field ("seq_lens[3]: sequence of 9000 tokens exceeds
 * max_tokens_per_micro_batch 4096"). The library never logs; the daemon maps
 * codes to gRPC status at its edge:
 *
 *   -EINVAL    INVALID_ARGUMENT     bad shapes, values, names
 *   -ENOENT    NOT_FOUND            missing file / unknown tensor
 *   -ENOMEM    RESOURCE_EXHAUSTED   allocation failed; engine stays usable
 *   -EPERM     PERMISSION_DENIED    path escapes a root
 *   -EBADMSG   DATA_LOSS            corrupt checkpoint / file
 *   -ENODEV    FAILED_PRECONDITION  device or engine not built / registered
 *   -EALREADY  FAILED_PRECONDITION  wrong state (not initialized, wrong mode)
 *   -EIO       INTERNAL             I/O or device failure
 */
#ifndef ENGINED_ERR_H
#define ENGINED_ERR_H

#include <errno.h>
#include <stdarg.h>

#define ENG_ERROR_MSG_MAX 512

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

/* Short name of an error code ("EINVAL"), for logs and tests. */
const char *eng_strerror(int code);

#endif
