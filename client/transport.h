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

/* max_recv_bytes: reply size limit (<= 0: 1 GiB). Returns 0 or a status
 * code; *ret untouched on failure. */
int ect_open(const char *target, int64_t max_recv_bytes, struct ect_channel **ret,
	     char msg[ECT_MSG_MAX]);
void ect_close(struct ect_channel *ch);  /* accepts NULL */

/* One unary call. timeout_ms <= 0: no deadline. On OK *ret_resp is a
 * malloc'ed copy of the reply (caller frees). */
int ect_unary(struct ect_channel *ch, const char *method, const void *req, size_t len,
	      int64_t timeout_ms, uint8_t **ret_resp, size_t *ret_len,
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

#endif
