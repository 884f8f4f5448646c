/* dispatch.h — the dispatcher and the engine thread (dispatch.c), as the
 * daemon's lifecycle (lifecycle.c) starts them: the gRPC server's callback
 * for every call, the engine thread's body, and the replay table's requeue
 * of a duplicate whose original never ran. */
#ifndef ENGINED_DAEMON_DISPATCH_H
#define ENGINED_DAEMON_DISPATCH_H

#include "daemon.h"

/* rpc_server_start's on_call (ctx: the daemon). */
void dispatch_on_call(void *ctx, struct rpc_call *call, int method);
/* The engine thread (arg: the daemon): runs queued jobs in order until
 * the daemon stops, then refuses what is left, saves on stop and destroys
 * the engine. */
void *dispatch_engine_thread(void *arg);
/* replay_new's requeue (ctx: the daemon). */
void dispatch_replay_requeue(void *ctx, struct job *j);

#endif
