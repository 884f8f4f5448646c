/* methods.c — the method table (see methods.h). */
#include "methods.h"

#include <errno.h>

#include "engined/v1/engine.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "export.h"
#include "handlers.h"
#include "health.h"
#include "reflection.h"
#include "reflection.pb-c.h"
#include "service_method.h"

static int run_health_check(struct daemon *d, struct job *j, struct eng_error *err)
{
	return health_check(&d->health, j, err);
}

static int run_health_watch(struct daemon *d, struct job *j, struct eng_error *err)
{
	return health_watch(&d->health, j, err);
}

static int run_reflection(struct daemon *d, struct job *j, struct eng_error *err)
{
	return reflection_serve(d->refl, j, err);
}

#define ENGINE_SVC &engined__v1__training_engine__descriptor
#define HEALTH_SVC &grpc__health__v1__health__descriptor
#define REFLECTION_SVC &grpc__reflection__v1__server_reflection__descriptor

#define ENG(n, init, v, r) \
	{ .service = ENGINE_SVC, .name = n, .flags = M_REPLAY, .where = RUN_ENGINE, \
	  .needs_init = init, .validate = v, .run = r }

struct method daemon_methods[] = {
	ENG("Initialize", false, h_validate_initialize, h_run_initialize),
	ENG("SetMode", true, h_validate_set_mode, h_run_set_mode),
	ENG("ForwardBackward", true, h_validate_forward_backward,
	    h_run_forward_backward),
	ENG("OptimizerStep", true, h_validate_optimizer_step,
	    h_run_optimizer_step),
	ENG("ZeroGrad", true, NULL, h_run_zero_grad),
	ENG("LrSchedulerStep", true, NULL, h_run_lr_scheduler_step),
	ENG("ToDevice", true, h_validate_to_device, h_run_to_device),
	{ .service = ENGINE_SVC, .name = "GetPerTensorParam", .server_streaming = true,
	  .flags = M_READ_ONLY, .where = RUN_ENGINE, .needs_init = true,
	  .validate = h_validate_get_params, .run = h_run_get_params },
	ENG("SaveCheckpoint", true, h_validate_save_checkpoint,
	    h_run_save_checkpoint),
	ENG("LoadCheckpoint", true, h_validate_load_checkpoint,
	    h_run_load_checkpoint),
	{ .service = ENGINE_SVC, .name = "GetStatus", .flags = M_READ_ONLY | M_TENANT_FREE,
	  .where = RUN_INLINE, .run = h_run_get_status },
	{ .service = ENGINE_SVC, .name = "CreateGroup", .where = RUN_INLINE,
	  .validate = h_validate_create_group, .run = h_run_create_group },
	{ .service = HEALTH_SVC, .name = "Check", .label = "Health.Check",
	  .flags = M_READ_ONLY | M_HEALTH | M_TENANT_FREE, .where = RUN_INLINE,
	  .run = run_health_check },
	{ .service = HEALTH_SVC, .name = "Watch", .label = "Health.Watch",
	  .server_streaming = true, .flags = M_READ_ONLY | M_HEALTH | M_TENANT_FREE,
	  .where = RUN_OWN, .run = run_health_watch },
	/* v1alpha and v1 share their messages: v1's descriptor under both
	 * packages. */
	{ .service = REFLECTION_SVC, .package = "grpc.reflection.v1alpha",
	  .name = "ServerReflectionInfo", .label = "Reflection.v1alpha",
	  .server_streaming = true, .client_streaming = true,
	  .flags = M_READ_ONLY | M_TENANT_FREE, .where = RUN_OWN, .run = run_reflection },
	{ .service = REFLECTION_SVC, .name = "ServerReflectionInfo", .label = "Reflection.v1",
	  .server_streaming = true, .client_streaming = true,
	  .flags = M_READ_ONLY | M_TENANT_FREE, .where = RUN_OWN, .run = run_reflection },
	/* Rows are only ever added at the end: a row's index is its metrics
	 * row and the fuzz seeds' byte 0 (tests/fuzz/make_corpus.py ROWS). */
	{ .service = ENGINE_SVC, .name = "ShareWeights", .flags = M_READ_ONLY,
	  .where = RUN_ENGINE, .needs_init = true,
	  .validate = h_validate_share_weights, .run = h_run_share_weights },
	/* LoRA adapters: the request's `name` is the adapter (its tenant and
	 * request-id space). */
	{ .service = ENGINE_SVC, .name = "CreateAdapter", .flags = M_REPLAY,
	  .where = RUN_ENGINE, .needs_init = true, .adapter_field = "name",
	  .validate = h_validate_create_adapter, .run = h_run_create_adapter },
	{ .service = ENGINE_SVC, .name = "DeleteAdapter", .flags = M_REPLAY,
	  .where = RUN_ENGINE, .needs_init = true, .adapter_field = "name",
	  .validate = h_validate_delete_adapter, .run = h_run_delete_adapter },
	/* Generation: an engine job (the weights cannot change while it runs);
	 * it changes no state, so it is not replayed. */
	{ .service = ENGINE_SVC, .name = "Sample", .server_streaming = true,
	  .flags = M_READ_ONLY, .where = RUN_ENGINE, .needs_init = true,
	  .validate = h_validate_sample, .run = h_run_sample },
};
#define N_METHODS (int)(sizeof(daemon_methods) / sizeof(daemon_methods[0]))
const int daemon_n_methods = N_METHODS;
const char *daemon_method_paths[N_METHODS];
const char *daemon_method_labels[N_METHODS];

_Static_assert(sizeof(daemon_methods) / sizeof(daemon_methods[0]) < METRICS_METHODS,
	       "metrics has a row per method plus one");

int methods_init(struct eng_error *err)
{
	for (int i = 0; i < N_METHODS; i++) {
		struct method *m = &daemon_methods[i];
		const ProtobufCMethodDescriptor *md =
			service_method(m->service, m->package, m->name, m->path, sizeof(m->path));

		if (!md)
			return eng_fail(err, -EINVAL, "method table: %s has no method %s",
					m->service->name, m->name);
		m->id = i;
		m->req_desc = m->client_streaming ? NULL : md->input;
		m->adapter_fd = NULL;
		if (m->req_desc) {
			const char *f = m->adapter_field ? m->adapter_field : "adapter";

			m->adapter_fd = protobuf_c_message_descriptor_get_field_by_name(m->req_desc,
											f);
			if (m->adapter_fd && (m->adapter_fd->type != PROTOBUF_C_TYPE_STRING ||
					      m->adapter_fd->label == PROTOBUF_C_LABEL_REPEATED))
				return eng_fail(err, -EINVAL, "method table: %s.%s is no string",
						m->req_desc->name, f);
			if (!m->adapter_fd && m->adapter_field)
				return eng_fail(err, -EINVAL, "method table: %s has no field %s",
						m->req_desc->name, f);
		}
		daemon_method_paths[i] = m->path;
		daemon_method_labels[i] = method_label(m);
	}
	return 0;
}
