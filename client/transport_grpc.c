/* transport_grpc.c — transport.h on the gRPC C core: each blocking call
 * has its own pluck completion queue (pluck and next cannot share one). */
#include "transport.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "grpc_bytes.h"

#define CODE_RESOURCE_EXHAUSTED 8
#define CODE_INTERNAL 13
#define CODE_UNAVAILABLE 14

struct ect_channel {
	grpc_channel *channel;
	grpc_metadata auth_md;      /* authorization, when has_auth */
	bool has_auth;
};

struct ect_stream {
	grpc_call *call;
	grpc_completion_queue *cq;
	grpc_metadata_array md_initial, md_trailing;
	grpc_status_code status;
	grpc_slice details;
	bool ended;       /* status received */
	int tag;          /* distinct addresses for pluck */
	/* The message lent out by ect_stream_next_segs (until the next call):
	 * the buffer, its reader (which owns a decompressed copy when the
	 * message came compressed) and the segments over its slices. */
	grpc_byte_buffer *held;
	grpc_byte_buffer_reader rd;
	bool rd_live;
	struct ect_seg *segs;          /* [segs_cap] */
	size_t segs_cap;
};

static gpr_timespec deadline_of(int64_t timeout_ms)
{
	if (timeout_ms <= 0)
		return gpr_inf_future(GPR_CLOCK_MONOTONIC);
	return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
			    gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

static void set_msg(char msg[ECT_MSG_MAX], const char *s, size_t len)
{
	if (len >= ECT_MSG_MAX)
		len = ECT_MSG_MAX - 1;
	memcpy(msg, s, len);
	msg[len] = '\0';
}

/* gRPC reads a stream into 64 KiB slices from malloc and frees them when
 * the message is consumed. With glibc's default trim threshold (128 KiB)
 * that memory went back to the kernel after every message and the next
 * message's reads faulted it in again, zeroed: on a weight stream (loopback,
 * 4 MiB messages) page faults and brk were 26-42% of the client's CPU
 * (perf, 2026-12-03). A trim threshold above what a stream holds at once
 * (the flow-control window plus a message) keeps those pages in the heap
 * for reuse. Setting it turns off glibc's own raising of the mmap
 * threshold (up to 32 MiB as large blocks are freed), so that is set to
 * its ceiling too: otherwise every block of 128 KiB or more (a message
 * copied out whole) would be a fresh mmap, faulted in again each time.
 * Process-wide (glibc has one heap policy), set once; Python's client does
 * the same (engined_client/_rpc.py: keep_heap_pages). */
#define TRIM_THRESHOLD (64 << 20)
#define MMAP_THRESHOLD (32 << 20)

static pthread_once_t heap_once = PTHREAD_ONCE_INIT;

static void keep_heap_pages(void)
{
#if defined(M_TRIM_THRESHOLD) && defined(M_MMAP_THRESHOLD)
	(void)mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
	(void)mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD);
#endif
}

int ect_open(const char *target, int64_t max_recv_bytes, struct ect_channel **ret,
	     char msg[ECT_MSG_MAX])
{
	return ect_open_secure(target, max_recv_bytes, NULL, ret, msg);
}

int ect_open_secure(const char *target, int64_t max_recv_bytes,
		    const struct ect_security *sec, struct ect_channel **ret,
		    char msg[ECT_MSG_MAX])
{
	struct ect_channel *ch = calloc(1, sizeof(*ch));
	grpc_channel_credentials *creds;
	grpc_ssl_pem_key_cert_pair pair;
	grpc_arg args[5];
	grpc_channel_args ca;

	if (!ch) {
		set_msg(msg, "out of memory", 13);
		return CODE_RESOURCE_EXHAUSTED;
	}
	pthread_once(&heap_once, keep_heap_pages);
	grpc_init();
	memset(args, 0, sizeof(args));
	args[0].type = GRPC_ARG_INTEGER;
	args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
	args[0].value.integer = max_recv_bytes > 0 && max_recv_bytes < INT32_MAX ?
				(int)max_recv_bytes : 1 << 30;
	args[1].type = GRPC_ARG_INTEGER;
	args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
	args[1].value.integer = -1;
	/* Receive window: a fixed 64 MiB per stream instead of gRPC's BDP
	 * probing. With probing, a weight stream (MiB-sized messages, one in
	 * flight) over loopback cost twice the CPU per byte and ran at ~60%
	 * of raw TCP; with this window ~100% (tests/bench/bench_stream). */
	args[2].type = GRPC_ARG_INTEGER;
	args[2].key = (char *)GRPC_ARG_HTTP2_BDP_PROBE;
	args[2].value.integer = 0;
	args[3].type = GRPC_ARG_INTEGER;
	args[3].key = (char *)GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
	args[3].value.integer = 64 << 20;
	ca.num_args = 4;
	ca.args = args;
	if (sec && sec->server_name) {
		args[4].type = GRPC_ARG_STRING;
		args[4].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
		args[4].value.string = (char *)sec->server_name;
		ca.num_args = 5;
	}
	if (sec && sec->root_pem) {
		pair.private_key = sec->key_pem;
		pair.cert_chain = sec->cert_pem;
		creds = grpc_ssl_credentials_create(sec->root_pem,
				sec->cert_pem && sec->key_pem ? &pair : NULL, NULL, NULL);
	} else {
		creds = grpc_insecure_credentials_create();
	}
	ch->channel = creds ? grpc_channel_create(target, creds, &ca) : NULL;
	if (creds)
		grpc_channel_credentials_release(creds);
	if (!ch->channel) {
		free(ch);
		grpc_shutdown();
		snprintf(msg, ECT_MSG_MAX, "cannot create a channel to %s", target);
		return CODE_UNAVAILABLE;
	}
	if (sec && sec->token) {
		char *v = malloc(strlen(sec->token) + 8);

		if (!v) {
			ect_close(ch);
			set_msg(msg, "out of memory", 13);
			return CODE_RESOURCE_EXHAUSTED;
		}
		sprintf(v, "Bearer %s", sec->token);
		ch->auth_md.key = grpc_slice_from_static_string("authorization");
		ch->auth_md.value = grpc_slice_from_copied_string(v);
		explicit_bzero(v, strlen(v));
		free(v);
		ch->has_auth = true;
	}
	*ret = ch;
	return 0;
}

void ect_close(struct ect_channel *ch)
{
	if (!ch)
		return;
	if (ch->has_auth)
		grpc_slice_unref(ch->auth_md.value);
	grpc_channel_destroy(ch->channel);
	free(ch);
	grpc_shutdown();
}

static void cq_destroy(grpc_completion_queue *cq)
{
	grpc_completion_queue_shutdown(cq);
	while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME),
					   NULL).type != GRPC_QUEUE_SHUTDOWN)
		;
	grpc_completion_queue_destroy(cq);
}

static grpc_call *call_new(struct ect_channel *ch, grpc_completion_queue *cq,
			   const char *method, int64_t timeout_ms)
{
	grpc_slice m = grpc_slice_from_static_string(method);

	return grpc_channel_create_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
					m, NULL, deadline_of(timeout_ms), NULL);
}

int ect_unary(struct ect_channel *ch, const char *method, const void *req, size_t len,
	      int64_t timeout_ms, const char *request_id, uint8_t **ret_resp, size_t *ret_len,
	      char msg[ECT_MSG_MAX])
{
	grpc_metadata md[2];
	size_t n_md = 0;
	grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
	grpc_call *call = call_new(ch, cq, method, timeout_ms);
	grpc_metadata_array md_initial, md_trailing;
	grpc_byte_buffer *send_bb, *recv_bb = NULL;
	grpc_status_code status = GRPC_STATUS_UNKNOWN;
	grpc_slice details = grpc_empty_slice(), s;
	grpc_op ops[6];
	grpc_event ev;
	int tag = 0, r;

	s = grpc_slice_from_copied_buffer(req, len);
	send_bb = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	grpc_metadata_array_init(&md_initial);
	grpc_metadata_array_init(&md_trailing);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	memset(md, 0, sizeof(md));
	if (ch->has_auth)
		md[n_md++] = ch->auth_md;
	if (request_id) {
		md[n_md].key = grpc_slice_from_static_string("engined-request-id");
		md[n_md++].value = grpc_slice_from_copied_string(request_id);
	}
	ops[0].data.send_initial_metadata.count = n_md;
	ops[0].data.send_initial_metadata.metadata = n_md ? md : NULL;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = send_bb;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_initial;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &recv_bb;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &md_trailing;
	ops[5].data.recv_status_on_client.status = &status;
	ops[5].data.recv_status_on_client.status_details = &details;
	if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
		set_msg(msg, "start_batch failed", 18);
		r = CODE_INTERNAL;
		goto out;
	}
	ev = grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	(void)ev;
	r = (int)status;
	set_msg(msg, (const char *)GRPC_SLICE_START_PTR(details), GRPC_SLICE_LENGTH(details));
	if (r == 0) {
		if (!recv_bb) {
			set_msg(msg, "reply without a message", 23);
			r = CODE_INTERNAL;
		} else if (grpc_bytes_flatten(recv_bb, ret_resp, ret_len) < 0) {
			set_msg(msg, "out of memory", 13);
			r = CODE_RESOURCE_EXHAUSTED;
		}
	}
out:
	if (recv_bb)
		grpc_byte_buffer_destroy(recv_bb);
	grpc_byte_buffer_destroy(send_bb);
	grpc_slice_unref(details);
	grpc_metadata_array_destroy(&md_initial);
	grpc_metadata_array_destroy(&md_trailing);
	if (request_id)
		grpc_slice_unref(md[n_md - 1].value);
	grpc_call_unref(call);
	cq_destroy(cq);
	return r;
}

int ect_stream_open(struct ect_channel *ch, const char *method, const void *req,
		    size_t len, int64_t timeout_ms, struct ect_stream **ret,
		    char msg[ECT_MSG_MAX])
{
	struct ect_stream *st = calloc(1, sizeof(*st));
	grpc_byte_buffer *send_bb;
	grpc_slice s;
	grpc_op ops[4];

	if (!st) {
		set_msg(msg, "out of memory", 13);
		return CODE_RESOURCE_EXHAUSTED;
	}
	st->cq = grpc_completion_queue_create_for_pluck(NULL);
	st->call = call_new(ch, st->cq, method, timeout_ms);
	st->details = grpc_empty_slice();
	grpc_metadata_array_init(&st->md_initial);
	grpc_metadata_array_init(&st->md_trailing);
	s = grpc_slice_from_copied_buffer(req, len);
	send_bb = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	if (ch->has_auth) {
		ops[0].data.send_initial_metadata.count = 1;
		ops[0].data.send_initial_metadata.metadata = &ch->auth_md;
	}
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = send_bb;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &st->md_initial;
	if (grpc_call_start_batch(st->call, ops, 4, &st->tag, NULL) != GRPC_CALL_OK) {
		grpc_byte_buffer_destroy(send_bb);
		st->ended = true;
		ect_stream_close(st);
		set_msg(msg, "start_batch failed", 18);
		return CODE_INTERNAL;
	}
	grpc_completion_queue_pluck(st->cq, &st->tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	grpc_byte_buffer_destroy(send_bb);
	*ret = st;
	return 0;
}

/* Receive the final status (after the last message or a cancel). */
static int stream_finish(struct ect_stream *st, char msg[ECT_MSG_MAX])
{
	grpc_op op;

	if (!st->ended) {
		memset(&op, 0, sizeof(op));
		op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
		op.data.recv_status_on_client.trailing_metadata = &st->md_trailing;
		op.data.recv_status_on_client.status = &st->status;
		op.data.recv_status_on_client.status_details = &st->details;
		if (grpc_call_start_batch(st->call, &op, 1, &st->tag, NULL) == GRPC_CALL_OK)
			grpc_completion_queue_pluck(st->cq, &st->tag,
						    gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
		else
			st->status = GRPC_STATUS_INTERNAL;
		st->ended = true;
	}
	if (msg)
		set_msg(msg, (const char *)GRPC_SLICE_START_PTR(st->details),
			GRPC_SLICE_LENGTH(st->details));
	return (int)st->status;
}

static void stream_drop_held(struct ect_stream *st)
{
	if (st->rd_live)
		grpc_byte_buffer_reader_destroy(&st->rd);
	st->rd_live = false;
	if (st->held)
		grpc_byte_buffer_destroy(st->held);
	st->held = NULL;
}

/* Wait for the next message: 1 with *ret (caller destroys it), or the
 * stream's final status. */
static int stream_recv(struct ect_stream *st, grpc_byte_buffer **ret, char msg[ECT_MSG_MAX])
{
	grpc_byte_buffer *bb = NULL;
	grpc_op op;

	stream_drop_held(st);
	if (st->ended)
		return stream_finish(st, msg);
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = &bb;
	if (grpc_call_start_batch(st->call, &op, 1, &st->tag, NULL) != GRPC_CALL_OK)
		return stream_finish(st, msg);
	grpc_completion_queue_pluck(st->cq, &st->tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	if (!bb)
		return stream_finish(st, msg);
	*ret = bb;
	return 1;
}

/* End a stream from the client side after a local failure. */
static int stream_abort(struct ect_stream *st, int code, const char *why,
			char msg[ECT_MSG_MAX])
{
	stream_drop_held(st);
	grpc_call_cancel(st->call, NULL);
	stream_finish(st, NULL);
	set_msg(msg, why, strlen(why));
	return code;
}

int ect_stream_next_segs(struct ect_stream *st, const struct ect_seg **ret_segs,
			 size_t *ret_n, size_t *ret_len, char msg[ECT_MSG_MAX])
{
	grpc_byte_buffer *bb = NULL;
	grpc_slice *sl;
	size_t n = 0, len = 0;
	int r = stream_recv(st, &bb, msg);

	if (r != 1)
		return r;
	st->held = bb;
	/* The reader decompresses when needed; peek lends its slices. */
	if (!grpc_byte_buffer_reader_init(&st->rd, bb))
		return stream_abort(st, CODE_INTERNAL, "cannot read a message", msg);
	st->rd_live = true;
	while (grpc_byte_buffer_reader_peek(&st->rd, &sl)) {
		if (n == st->segs_cap) {
			size_t cap = st->segs_cap ? 2 * st->segs_cap : 64;
			struct ect_seg *g = realloc(st->segs, cap * sizeof(*g));

			if (!g)
				return stream_abort(st, CODE_RESOURCE_EXHAUSTED,
						    "out of memory", msg);
			st->segs = g;
			st->segs_cap = cap;
		}
		st->segs[n].data = GRPC_SLICE_START_PTR(*sl);
		st->segs[n].len = GRPC_SLICE_LENGTH(*sl);
		len += st->segs[n++].len;
	}
	*ret_segs = st->segs;
	*ret_n = n;
	*ret_len = len;
	return 1;
}

int ect_stream_next(struct ect_stream *st, uint8_t **ret_msg, size_t *ret_len,
		    char msg[ECT_MSG_MAX])
{
	grpc_byte_buffer *bb = NULL;
	int r = stream_recv(st, &bb, msg);

	if (r != 1)
		return r;
	r = grpc_bytes_flatten(bb, ret_msg, ret_len);
	grpc_byte_buffer_destroy(bb);
	if (r == -ENOMEM)
		return stream_abort(st, CODE_RESOURCE_EXHAUSTED, "out of memory", msg);
	if (r < 0)
		return stream_abort(st, CODE_INTERNAL, "cannot read a message", msg);
	return 1;
}

void ect_stream_close(struct ect_stream *st)
{
	if (!st)
		return;
	stream_drop_held(st);
	if (!st->ended) {
		grpc_call_cancel(st->call, NULL);
		stream_finish(st, NULL);
	}
	free(st->segs);
	grpc_slice_unref(st->details);
	grpc_metadata_array_destroy(&st->md_initial);
	grpc_metadata_array_destroy(&st->md_trailing);
	grpc_call_unref(st->call);
	cq_destroy(st->cq);
	free(st);
}
