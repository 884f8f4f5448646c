/* share_socket.h — ShareWeights' side socket ([server] share_socket): a
 * unix SOCK_SEQPACKET socket where a consumer on this host trades a share's
 * handle for its file descriptor (SCM_RIGHTS).
 *
 * Protocol (engine.proto, ShareWeightsRequest): the consumer sends one
 * datagram of exactly SHARE_HANDLE_BYTES; the daemon answers one datagram,
 * byte 0 a status (enum share_status) and then a UTF-8 message, with the
 * descriptor attached when the status is SHARE_OK, and closes the
 * connection. Anything else (another length, nothing within
 * SHARE_SOCKET_TIMEOUT_MS) closes it too.
 *
 * Security: the socket file is made with mode 0660 (owner and group of the
 * daemon), after a bind that is not yet listening, and checked to be the
 * socket this process bound; a consumer needs the group and a handle, which
 * only an authenticated ShareWeights call hands out. Each peer's pid, uid
 * and gid (SO_PEERCRED) are logged with what it got.
 *
 * One thread serves it: poll() over the listening socket and at most
 * SHARE_SOCKET_MAX_CONNS connections (more wait in the listen backlog), each
 * closed at its deadline; the same thread sweeps the table's expired
 * shares. share_socket_stop wakes and joins it, closes its connections and
 * removes the socket file (only if it is still the one it made).
 */
#ifndef ENGINED_DAEMON_SHARE_SOCKET_H
#define ENGINED_DAEMON_SHARE_SOCKET_H

#include "err.h"
#include "share_table.h"

#define SHARE_SOCKET_MAX_CONNS 16
#define SHARE_SOCKET_TIMEOUT_MS 5000

/* Byte 0 of the daemon's answer. */
enum share_status {
	SHARE_OK = 0,                 /* the descriptor is attached */
	SHARE_UNKNOWN = 1,            /* unknown, used up or expired handle */
	SHARE_MALFORMED = 2,          /* not one datagram of the handle's length */
	SHARE_RETRY = 3,              /* the daemon is out of descriptors: try again */
};

struct share_socket;

/* Bind `path` (absolute, shorter than sun_path) and start the thread over
 * table t (borrowed until share_socket_stop). A socket file left by a
 * daemon that is gone is replaced; a socket someone listens on, or a path
 * that is not a socket, is refused (-EADDRINUSE, -EEXIST) naming it. */
int share_socket_start(const char *path, struct share_table *t, struct share_socket **ret,
		       struct eng_error *err);
/* Accepts NULL. */
void share_socket_stop(struct share_socket *s);

#endif
