/* job.h — one RPC from decode to reply: the method table's row type, the
 * job that carries a call through validation, the queue and the engine
 * thread, and the rules every reply follows (engine code -> gRPC status,
 * one log line and one metrics sample per RPC). Nothing here knows the
 * daemon's state: handlers, the dispatcher and the ops services all build
 * on this file, and it on none of them. */
#ifndef ENGINED_DAEMON_JOB_H
#define ENGINED_DAEMON_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "auth.h"
#include "engine.h"
#include "err.h"
#include "metrics.h"
#include "rpc.h"

struct daemon;
struct job;

enum method_where {
	RUN_INLINE,  /* answered on the poller thread (never waits) */
	RUN_ENGINE,  /* queued for the engine thread */
	RUN_OWN,     /* run takes the call over and answers it later itself
		      * (Health/Watch, reflection): returns 0 once it has, or
		      * an error for dispatch to answer */
};

/* Method flags. */
enum {
	M_READ_ONLY = 1 << 0,  /* allowed with a read-only token */
	M_HEALTH = 1 << 1,     /* exempt from tokens with auth.health_exempt */
	M_REPLAY = 1 << 2,     /* changes state: a request id makes it exactly-once */
	/* A token limited to adapters (auth.h) may call it without naming
	 * one: it trains, reads and exports no model state (GetStatus, which
	 * then lists the token's adapters only; Health; reflection). */
	M_TENANT_FREE = 1 << 3,
};

/* One row of the method table (methods.c). The service and method names
 * select protobuf-c's generated method descriptor, from which methods_init
 * fills `path` and `req_desc`. validate runs on a poller thread before
 * anything is queued; it may attach derived data to the job (job->prep).
 * run does the work: for unary methods it leaves the packed reply in
 * job->reply; for streaming methods it sends the messages itself and the
 * dispatcher ends the stream with the returned status. */
struct method {
	const ProtobufCServiceDescriptor *service;
	const char *package;          /* NULL: the service's own */
	const char *name;             /* protobuf method name */
	const char *label;            /* in logs and metrics; NULL: name */
	bool server_streaming;
	bool client_streaming;
	unsigned flags;
	enum method_where where;
	bool needs_init;              /* the mode rules are the engine's (engine.c) */
	int (*validate)(struct daemon *d, struct job *j, struct eng_error *err);
	int (*run)(struct daemon *d, struct job *j, struct eng_error *err);
	/* The request's string field naming the LoRA adapter the call acts on
	 * (its tenant for tokens, its request-id space); NULL: the field
	 * "adapter", when the request has one (CreateAdapter's is "name"). */
	const char *adapter_field;
	/* Filled by methods_init. */
	int id;                       /* index in the table */
	char path[128];               /* "/engined.v1.TrainingEngine/Initialize" */
	const ProtobufCMessageDescriptor *req_desc;  /* NULL: client streaming */
	const ProtobufCFieldDescriptor *adapter_fd;  /* NULL: names no adapter */
};

struct job {
	struct job *next;
	const struct method *m;       /* NULL: an unknown method */
	struct rpc_call *call;
	struct daemon *d;             /* the dispatcher's (opaque here) */
	struct metrics *metrics;      /* where the call is counted */
	ProtobufCMessage *req;        /* unpacked request, owned */
	void *prep;                   /* from validate, owned */
	void (*prep_free)(void *prep);
	uint8_t *reply;               /* packed reply (malloc), owned */
	size_t reply_len;
	char identity[AUTH_NAME_MAX + 300];  /* "token:NAME", "cert:CN" or "-" */
	/* The caller's token when it is limited to adapters: its name and
	 * the adapters it may use (auth.h); tenant "" = not limited. */
	char token[AUTH_NAME_MAX];
	char tenant[AUTH_ADAPTERS_MAX];
	bool ran;                     /* the method's run was called */
	double t_start;               /* eng_now_s() when it started (a Sample's) */
	/* Called by job_finish before the reply goes out (the replay table
	 * records the outcome of a call that carries a request id). */
	void (*finish_hook)(struct job *j, int r, const struct eng_error *err);
	void *finish_ctx;
	/* Set by handlers for the metrics (engine thread). */
	int64_t m_tokens;             /* training ForwardBackward: tokens */
	bool m_step;                  /* an OptimizerStep ran */
	double m_grad_norm;
	bool m_saved;                 /* a checkpoint was saved */
};

/* The gRPC status of an engine error code (err.h's ENG_ERROR_CODES). */
enum rpc_code job_rpc_code(int err);

/* A new job for `call` (method m, NULL when unknown), or NULL (ENOMEM). */
struct job *job_new(struct rpc_call *call, const struct method *m, struct metrics *metrics);
/* Pack `msg` into a new malloc'ed buffer as the job's reply; -ENOMEM. */
int job_set_reply(struct job *j, const ProtobufCMessage *msg);
/* Reply with r (0: the packed reply, or OK ending a stream; < 0: its
 * status and err's message), log the outcome once and free the job. */
void job_finish(struct job *j, int r, const struct eng_error *err);
/* Answer with a status that did not come from an engine code (e.g.
 * UNAUTHENTICATED), log it and free the job. */
void job_refuse(struct job *j, enum rpc_code code, const char *msg);
/* RUN_OWN handlers: take the call over; the rest of the job (the request
 * too: its bytes stop counting as in flight) is freed. */
void job_release(struct job *j);

/* One log line per RPC (method, peer, identity, status, duration) and its
 * metrics sample, for calls answered outside job_finish (RUN_OWN). */
void job_log_rpc(struct metrics *metrics, struct rpc_call *call, const struct method *m,
		 const char *identity, enum rpc_code code, const char *msg);

/* The adapter the decoded request names (m->adapter_fd): "" for the base
 * model, for a method that names none and before the request is decoded. */
const char *job_adapter(const struct job *j);

/* Whether the call that ended with r changed anything: it ran, and it did
 * not stop with -ECANCELED (the engine's contract for a call stopped by its
 * client's cancellation or deadline: gradients as before, nothing saved,
 * nothing loaded, the previous engine kept). Only such calls are kept for
 * replays (replay.h). */
static inline bool job_had_effect(const struct job *j, int r)
{
	return j->ran && r != -ECANCELED;
}

/* The method's name in logs and metrics. */
static inline const char *method_label(const struct method *m)
{
	return m->label ? m->label : m->name;
}

#endif
