/* rpc.h — the daemon's view of gRPC: calls come in, replies go out.
 *
 * This is the only interface between the daemon and the gRPC C core; all
 * grpc_* calls live in rpc_grpc.c (the C-core API is not promised stable
 * between releases, so it is kept in one small module).
 *
 * Threads: poller threads deliver new calls through `on_call` and must not
 * block there. Any thread may reply. A call is owned by whoever received it
 * from on_call until it calls one of rpc_reply*() — exactly once — which
 * hands the call back (the struct may be freed at any time after).
 *
 * A call arrives with its metadata only: the owner decides on it first
 * (rpc_call_authorization, the method) and asks for the request message
 * with rpc_recv_next only once it accepts the call, so that the body of a
 * refused call is never read. Request bytes held by calls are bounded
 * (max_inflight_recv_bytes, see rpc_recv_next).
 *
 * Streaming (server streaming only): the owner starts at most one send at a
 * time with rpc_stream_send() and waits for it with rpc_stream_wait(); the
 * data of each piece is borrowed until its `release` callback runs (from
 * any thread, possibly after the call is over), which makes zero-copy sends
 * possible.
 */
#ifndef ENGINED_DAEMON_RPC_H
#define ENGINED_DAEMON_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* gRPC status codes (the numbers are fixed by the gRPC protocol). */
enum rpc_code {
	RPC_OK = 0,
	RPC_CANCELLED = 1,
	RPC_UNKNOWN = 2,
	RPC_INVALID_ARGUMENT = 3,
	RPC_DEADLINE_EXCEEDED = 4,
	RPC_NOT_FOUND = 5,
	RPC_ALREADY_EXISTS = 6,
	RPC_PERMISSION_DENIED = 7,
	RPC_RESOURCE_EXHAUSTED = 8,
	RPC_FAILED_PRECONDITION = 9,
	RPC_ABORTED = 10,
	RPC_OUT_OF_RANGE = 11,
	RPC_UNIMPLEMENTED = 12,
	RPC_INTERNAL = 13,
	RPC_UNAVAILABLE = 14,
	RPC_DATA_LOSS = 15,
	RPC_UNAUTHENTICATED = 16,
};

const char *rpc_code_name(enum rpc_code code);  /* "INVALID_ARGUMENT" */

struct rpc_server;
struct rpc_call;

struct rpc_server_config {
	const char *const *listen;     /* "127.0.0.1:50051", "unix:/path" */
	int n_listen;
	int64_t max_recv_bytes;        /* request size limit */
	int64_t max_inflight_recv_bytes;  /* request bytes held at once; 0: no bound */
	int64_t max_send_bytes;        /* reply / stream message size limit */
	int pollers;                   /* completion-queue threads, >= 1 */
	int max_concurrent_streams;
	int64_t default_deadline_ms;   /* for calls without one; 0: none */
	/* TLS on every TCP address when cert and key are set (unix sockets
	 * stay plaintext: their file mode guards them). PEM text, copied. */
	const char *tls_cert;
	const char *tls_key;
	const char *tls_client_ca;     /* mutual TLS */
	bool tls_require_client_cert;  /* with client_ca: refuse clients without */
};

/* Registered method paths ("/engined.v1.TrainingEngine/GetStatus"), index
 * = method id passed to on_call. A call to any other path reaches on_call
 * with method -1 and must be answered (UNIMPLEMENTED, or UNAUTHENTICATED
 * first). */
struct rpc_method_reg {
	const char *path;
	bool server_streaming;
	bool client_streaming;         /* several messages through rpc_recv_next */
};

/* Delivered on a poller thread once the call's metadata has arrived; no
 * byte of its message has been read. The callee owns `call` from here on:
 * it answers it, or asks for the message with rpc_recv_next. */
typedef void (*rpc_on_call_fn)(void *ctx, struct rpc_call *call, int method);

/* Create the server, bind every address, start `cfg->pollers` threads. On
 * failure writes a message into errbuf and returns a negative errno; *ret
 * untouched. */
int rpc_server_start(const struct rpc_server_config *cfg,
		     const struct rpc_method_reg *methods, int n_methods,
		     rpc_on_call_fn on_call, void *ctx,
		     struct rpc_server **ret, char *errbuf, size_t errlen);
/* Port bound for listen address i (TCP), 0 for unix sockets. */
int rpc_server_port_of(const struct rpc_server *s, int i);
/* The first TCP port bound, 0 when there is none. */
int rpc_server_port(const struct rpc_server *s);
/* New TLS certificates (PEM text, copied) for handshakes from now on;
 * connections already made keep theirs, so calls in progress go on.
 * -EINVAL when the server was started without TLS. */
int rpc_server_set_tls(struct rpc_server *s, const char *cert, const char *key,
		       const char *client_ca);
/* Bytes of stream messages handed to gRPC since the start. */
int64_t rpc_server_bytes_streamed(const struct rpc_server *s);
/* Request bytes held by calls now (see rpc_recv_next). */
int64_t rpc_server_inflight_bytes(const struct rpc_server *s);
/* Stop accepting calls (new ones get UNAVAILABLE from gRPC); calls in
 * progress continue. Idempotent. */
void rpc_server_shutdown(struct rpc_server *s);
/* After rpc_server_shutdown: wait up to grace_ms for the calls in progress
 * to finish, cancel the rest, stop the pollers, free everything. */
void rpc_server_destroy(struct rpc_server *s, int grace_ms);

/* --- one call ---------------------------------------------------------- */

/* Unary reply with a packed message (copied). Hands the call back. */
void rpc_reply(struct rpc_call *c, const void *msg, size_t len);
/* Status-only reply (any code; RPC_OK ends a stream). `msg` is copied.
 * Hands the call back. */
void rpc_reply_status(struct rpc_call *c, enum rpc_code code, const char *msg);

struct rpc_piece {
	const void *data;
	size_t len;
	void (*release)(void *user);   /* may be NULL: data is static/copied */
	void *user;
};

/* Start sending one stream message made of pieces[0..n) concatenated.
 * Each piece's release runs once gRPC no longer needs its data (also when
 * this fails). Returns 0, -EBUSY when a send is already in flight, or
 * -ECANCELED when the call is over (client cancel, deadline, disconnect). */
int rpc_stream_send(struct rpc_call *c, const struct rpc_piece *pieces, int n);
/* Block until the send in flight completes: 0 when it did, -ECANCELED when
 * the call ended first. Returns at once when no send is in flight. */
int rpc_stream_wait(struct rpc_call *c);

/* True once the client cancelled, the deadline passed or the peer left. */
bool rpc_call_cancelled(struct rpc_call *c);
/* What rpc_recv_next delivers. */
enum rpc_recv_result {
	RPC_RECV_MESSAGE,      /* msg, len: the next message, borrowed for the callback */
	RPC_RECV_END,          /* the client half-closed: no (more) message */
	RPC_RECV_GONE,         /* the call is over: cancelled, deadline, peer gone */
	RPC_RECV_OVER_BOUND,   /* len: the message's size; it was dropped on arrival,
				* since the request bytes held would pass
				* max_inflight_recv_bytes */
	RPC_RECV_NO_MEMORY,    /* the message could not be copied; dropped */
};

/* Ask for the next message of the call (the request of a unary or
 * server-streaming call; one of the messages of a client-streaming one).
 * `fn` runs once on a poller thread with the result. It is delivered only
 * once no stream send is in flight, so `fn` may rpc_stream_send a reply
 * (never wait for it there: it would block the poller). Returns 0, or
 * -EBUSY when a receive is already pending.
 *
 * Accounting: the message of a unary or server-streaming method counts
 * against max_inflight_recv_bytes from its arrival until the call is
 * handed back (rpc_reply*) or rpc_call_release_request; it is checked once
 * the whole message is there (gRPC's max_recv_bytes bounds one message
 * while it arrives). Messages of client-streaming methods are only
 * borrowed for the callback and do not count. */
typedef void (*rpc_recv_fn)(void *user, struct rpc_call *c, enum rpc_recv_result res,
			    const uint8_t *msg, size_t len);
int rpc_recv_next(struct rpc_call *c, rpc_recv_fn fn, void *user);
/* The owner no longer holds the request (e.g. a handler that keeps the
 * call but freed the message): its bytes stop counting. Idempotent. */
void rpc_call_release_request(struct rpc_call *c);
/* Request bytes held by all calls of c's server now. */
int64_t rpc_call_inflight_bytes(const struct rpc_call *c);

/* "ipv4:127.0.0.1:40000"; valid while the call is owned. */
const char *rpc_call_peer(const struct rpc_call *c);
/* Method path, as registered (or as requested for unknown methods). */
const char *rpc_call_method(const struct rpc_call *c);
/* Value of the `authorization` header: NULL unless the call carries
 * exactly one, of at most 4096 bytes. */
const char *rpc_call_authorization(const struct rpc_call *c);
/* How many `authorization` headers the call carries (any size). */
int rpc_call_authorization_count(const struct rpc_call *c);
/* The client's request id (engine.proto: `engined-request-id` metadata):
 * NULL unless the call carries exactly one, of at most RPC_REQUEST_ID_MAX
 * bytes without NUL; and how many such headers it carries. */
#define RPC_REQUEST_ID_HEADER "engined-request-id"
#define RPC_REQUEST_ID_MAX 128
const char *rpc_call_request_id(const struct rpc_call *c);
int rpc_call_request_id_count(const struct rpc_call *c);
/* Common name of a verified TLS client certificate, NULL without one. */
const char *rpc_call_cert_identity(const struct rpc_call *c);
/* Monotonic seconds since the call arrived. */
double rpc_call_elapsed(const struct rpc_call *c);
/* True once the call's deadline (the client's, else the server default)
 * has passed. */
bool rpc_call_expired(const struct rpc_call *c);

#endif
