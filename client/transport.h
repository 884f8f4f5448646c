/* transport.h — the client's view of gRPC: blocking unary calls and
 * server streams over one channel. All C-core use of the client lives in
 * transport_grpc.c. Results are gRPC status codes (0 = OK) with the
 * status message copied into `msg`. */
#ifndef ENGINED_CLIENT_TRANSPORT_H
#define ENGINED_CLIENT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#define ECT_MSG_MAX 512

struct ect_channel;
struct ect_stream;

/* Channel security; all PEM text (NUL-terminated), copied by ect_open.
 * TLS when root_pem is set (client certificate: cert_pem + key_pem). */
struct ect_security {
	const char *root_pem;
	const char *cert_pem;
	const char *key_pem;
	const char *server_name;   /* certificate name check override, or NULL */
	const char *token;         /* sent as `authorization: Bearer <token>` */
};

/* max_recv_bytes: reply size limit (<= 0: 1 GiB). sec may be NULL
 * (plaintext, no token). Returns 0 or a status code; *ret untouched on
 * failure. */
int ect_open(const char *target, int64_t max_recv_bytes, struct ect_channel **ret,
	     char msg[ECT_MSG_MAX]);
int ect_open_secure(const char *target, int64_t max_recv_bytes,
		    const struct ect_security *sec, struct ect_channel **ret,
		    char msg[ECT_MSG_MAX]);
void ect_close(struct ect_channel *ch);  /* accepts NULL */

/* One unary call. timeout_ms <= 0: no deadline. request_id: the
 * `engined-request-id` metadata, or NULL. On OK *ret_resp is a malloc'ed
 * copy of the reply (caller frees). */
int ect_unary(struct ect_channel *ch, const char *method, const void *req, size_t len,
	      int64_t timeout_ms, const char *request_id, uint8_t **ret_resp, size_t *ret_len,
	      char msg[ECT_MSG_MAX]);

/* A server stream: open sends the request; next returns 1 with a message
 * (malloc'ed, caller frees), 0 at the end of a stream that ended OK, or a
 * status code (> 0) when it ended otherwise (msg set). close cancels a
 * stream that has not ended and frees it. */
int ect_stream_open(struct ect_channel *ch, const char *method, const void *req,
		    size_t len, int64_t timeout_ms, struct ect_stream **ret,
		    char msg[ECT_MSG_MAX]);
int ect_stream_next(struct ect_stream *s, uint8_t **ret_msg, size_t *ret_len,
		    char msg[ECT_MSG_MAX]);
void ect_stream_close(struct ect_stream *s);  /* accepts NULL */

/* One piece of a received message, in gRPC's own buffers. */
struct ect_seg {
	const uint8_t *data;
	size_t len;
};

/* ect_stream_next without the copy (for large messages): on 1,
 * segs[0..*ret_n) are the message's bytes in order, *ret_len in all,
 * borrowed from gRPC until the next call on the stream or its close.
 * Other return values as ect_stream_next. */
int ect_stream_next_segs(struct ect_stream *s, const struct ect_seg **ret_segs,
			 size_t *ret_n, size_t *ret_len, char msg[ECT_MSG_MAX]);

#endif
