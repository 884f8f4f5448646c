/* auth.h — bearer tokens: the token file, the check of a call's
 * `authorization: Bearer ...` header, reload on SIGHUP.
 *
 * Token file: one token a line, '#' starts a comment line, blank lines are
 * skipped:
 *     [NAME:]TOKEN [full|read-only] [adapters=A[,B...]]
 * NAME ([A-Za-z0-9_.-]+) shows in the logs instead of the token; without it
 * the token is called "line-N". A TOKEN is at least 16 printable characters
 * without spaces or ':'; the scope defaults to full. A read-only token may
 * call GetStatus, GetPerTensorParam, ShareWeights, Health and reflection
 * (the methods.c rows flagged M_READ_ONLY); a full one anything. The file must not be readable by others (mode o-rwx).
 * adapters= limits the token to the LoRA adapters named (1 to 64
 * characters of [A-Za-z0-9_.-] each, comma-separated, the whole list at
 * most AUTH_ADAPTERS_MAX - 1 bytes): a call must name one of them (the
 * request's `adapter`, CreateAdapter's and DeleteAdapter's `name`), or be
 * a method flagged M_TENANT_FREE (GetStatus without an adapter, listing
 * only these; Health; reflection). Anything else, the base model's calls
 * included, is PERMISSION_DENIED naming the adapter (dispatch.c). The
 * scope still applies: "read-only adapters=a" may read adapter a only.
 *
 * Checks compare the presented token with every token, in time that
 * depends only on the presented token's length, and never stop early.
 *
 * Threads: auth_check from any thread; auth_reload from one thread at a
 * time. The token set is swapped whole under a rwlock.
 */
#ifndef ENGINED_DAEMON_AUTH_H
#define ENGINED_DAEMON_AUTH_H

#include <pthread.h>
#include <stdbool.h>

#include "err.h"

enum auth_level {
	AUTH_NONE = 0,
	AUTH_READ = 1,   /* read-only token */
	AUTH_FULL = 2,
};

#define AUTH_NAME_MAX 64
#define AUTH_ADAPTERS_MAX 1024   /* a token's adapters= list, with its NUL */

struct auth_tokens;

struct auth {
	pthread_rwlock_t lock;
	struct auth_tokens *tokens;   /* lock; NULL: no token file configured */
	char *path;                   /* owned */
};

/* Parse a token file into a new set (caller frees with auth_tokens_free).
 * Errors name the file and line: -EINVAL (format), -EPERM (mode), -errno. */
int auth_tokens_load(const char *path, struct auth_tokens **ret, struct eng_error *err);
void auth_tokens_free(struct auth_tokens *t);    /* accepts NULL */
int auth_tokens_count(const struct auth_tokens *t);

/* path NULL: tokens off (every call allowed). Loads the file now. */
int auth_init(struct auth *a, const char *path, struct eng_error *err);
void auth_fini(struct auth *a);
/* Re-read the file; on error the old tokens stay in force. */
int auth_reload(struct auth *a, struct eng_error *err);
bool auth_enabled(struct auth *a);

/* Check an `authorization` header value (NULL when the call had none).
 * Returns the level granted (AUTH_NONE: refuse) and the token's name in
 * ret_name (empty when refused). With tokens off, AUTH_FULL and "". */
enum auth_level auth_check(struct auth *a, const char *header, char ret_name[AUTH_NAME_MAX]);
/* auth_check, and the adapters the token is limited to in ret_adapters
 * (comma-separated; "" = not limited, and when refused). */
enum auth_level auth_check_tenant(struct auth *a, const char *header,
				  char ret_name[AUTH_NAME_MAX],
				  char ret_adapters[AUTH_ADAPTERS_MAX]);

/* Whether a token limited to `adapters` (auth_check_tenant's list; ""
 * = not limited) may use adapter `name`. */
bool auth_adapter_allowed(const char *adapters, const char *name);

#endif
