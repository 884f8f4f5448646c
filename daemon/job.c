/* job.c — the job lifecycle and the reply rules (see job.h). */
#include "job.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

enum rpc_code job_rpc_code(int err)
{
#define ENG_CODE_CASE(e, st, doc) case e: return RPC_##st;
	switch (-err) {
	case 0: return RPC_OK;
	ENG_ERROR_CODES(ENG_CODE_CASE)
	default: return RPC_INTERNAL;
	}
#undef ENG_CODE_CASE
}

struct job *job_new(struct rpc_call *call, const struct method *m, struct metrics *metrics)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->call = call;
	j->m = m;
	j->metrics = metrics;
	return j;
}

int job_set_reply(struct job *j, const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf = malloc(len ? len : 1);

	if (!buf)
		return -ENOMEM;
	protobuf_c_message_pack(msg, buf);
	free(j->reply);
	j->reply = buf;
	j->reply_len = len;
	return 0;
}

static void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->req)
		protobuf_c_message_free_unpacked(j->req, NULL);
	if (j->prep_free)
		j->prep_free(j->prep);
	free(j->reply);
	free(j);
}

void job_log_rpc(struct metrics *metrics, struct rpc_call *call, const struct method *m,
		 const char *identity, enum rpc_code code, const char *msg)
{
	const char *name = m ? method_label(m) : rpc_call_method(call);
	double s = rpc_call_elapsed(call);

	metrics_rpc(metrics, m ? m->id : -1, (int)code, s);
	if (code == RPC_OK)
		log_msg(LOG_LVL_INFO, "rpc %s peer=%s identity=%s status=OK %.1f ms", name,
			rpc_call_peer(call), identity, s * 1e3);
	else
		log_msg(code == RPC_INTERNAL || code == RPC_DATA_LOSS ? LOG_LVL_ERROR :
			LOG_LVL_INFO, "rpc %s peer=%s identity=%s status=%s %.1f ms: %s",
			name, rpc_call_peer(call), identity, rpc_code_name(code), s * 1e3,
			msg && msg[0] ? msg : "-");
}

void job_refuse(struct job *j, enum rpc_code code, const char *msg)
{
	job_log_rpc(j->metrics, j->call, j->m, j->identity[0] ? j->identity : "-", code, msg);
	rpc_reply_status(j->call, code, msg);
	j->call = NULL;
	job_free(j);
}

void job_finish(struct job *j, int r, const struct eng_error *err)
{
	enum rpc_code code = job_rpc_code(r);

	if (j->finish_hook)
		j->finish_hook(j, r, err);
	const char *msg = r < 0 ? (err && err->code && err->msg[0] ? err->msg :
				   eng_strerror(r)) : "";

	job_log_rpc(j->metrics, j->call, j->m, j->identity[0] ? j->identity : "-", code, msg);
	if (r < 0)
		rpc_reply_status(j->call, code, msg);
	else if (j->m && j->m->server_streaming)
		rpc_reply_status(j->call, RPC_OK, NULL);
	else
		rpc_reply(j->call, j->reply, j->reply_len);
	j->call = NULL;
	job_free(j);
}

const char *job_adapter(const struct job *j)
{
	const ProtobufCFieldDescriptor *fd = j->m ? j->m->adapter_fd : NULL;
	const char *name;

	if (!fd || !j->req)
		return "";
	name = *(const char *const *)((const char *)j->req + fd->offset);
	return name ? name : "";
}

void job_release(struct job *j)
{
	rpc_call_release_request(j->call);
	j->call = NULL;
	job_free(j);
}
