/* reflection.h — gRPC server reflection (grpc.reflection.v1alpha and v1
 * ServerReflectionInfo) from the descriptor set embedded at build time. */
#ifndef ENGINED_DAEMON_REFLECTION_H
#define ENGINED_DAEMON_REFLECTION_H

#include "job.h"

struct reflection;

/* Index the embedded descriptor set; the services listed are those of the
 * method paths given ("/pkg.Service/Method"), each of which must be in the
 * set (-EBADMSG otherwise). */
int reflection_new(const char *const *paths, int n_paths, struct reflection **ret,
		   struct eng_error *err);
void reflection_free(struct reflection *rf);
/* RUN_OWN: take the job's bidi call over and answer each request. rf NULL:
 * UNIMPLEMENTED. */
int reflection_serve(const struct reflection *rf, struct job *j, struct eng_error *err);

#endif
