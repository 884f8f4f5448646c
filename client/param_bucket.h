/* param_bucket.h — a ParamBucket decoded where gRPC received it.
 *
 * A weight-stream message is a few hundred bytes of TensorSlice metadata
 * and megabytes of `data`, spread over gRPC's receive buffers (segments,
 * split wherever frames and reads fell). The decoder gathers every field but
 * `data` into one small buffer for protobuf-c and only locates `data`, so
 * that each TensorSlice is copied once, from gRPC's buffers to its tensor.
 * Any valid encoding is accepted (fields in any order, unknown fields, a
 * repeated `data` of which the last counts, as protobuf says).
 */
#ifndef ENGINED_CLIENT_PARAM_BUCKET_H
#define ENGINED_CLIENT_PARAM_BUCKET_H

#include <stddef.h>
#include <stdint.h>

#include "engined/v1/engine.pb-c.h"
#include "transport.h"

/* A read position in a message made of segments. */
struct ecb_reader {
	const struct ect_seg *segs;
	size_t n, i, off;              /* segment i, byte off in it */
	size_t left;                   /* bytes after the position (bounded) */
};

struct ecb_bucket {
	/* Every field but data (data.len = 0); owned, NULL when none. */
	Engined__V1__ParamBucket *msg;
	size_t data_len;
	/* Private: the data's start, a cursor cur_off bytes into it, and the
	 * gathered fields (kept across messages). */
	struct ecb_reader data, cur;
	size_t cur_off;
	uint8_t *fields;
	size_t fields_cap;
};

/* Decode the message segs[0..n) (len bytes in all), which must stay valid
 * while b refers to it. Replaces what b held. Returns 0, -ENOMEM, or
 * -EBADMSG when it is not a ParamBucket (b then holds no message). */
int ecb_parse(struct ecb_bucket *b, const struct ect_seg *segs, size_t n, size_t len);
/* Copy data bytes [off, off + len) to dst. Copies in increasing order are
 * cheapest (the cursor moves on). Returns 0 or -ERANGE. */
int ecb_copy(struct ecb_bucket *b, size_t off, uint8_t *dst, size_t len);
/* Drop the message (keeps the scratch buffer). */
void ecb_clear(struct ecb_bucket *b);
/* Free everything; b may be reused after (zeroed). */
void ecb_free(struct ecb_bucket *b);

#endif
