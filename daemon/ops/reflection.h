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
/* The packed ServerReflectionResponse to one request message (its bytes as
 * received): what reflection_serve sends for each. *ret is malloc'ed (the
 * caller frees it). -EINVAL (err says why) when msg is not a
 * ServerReflectionRequest or a string in it is not UTF-8 without NUL
 * (wire_check), -ENOMEM. */
int reflection_answer(const struct reflection *rf, const uint8_t *msg, size_t len,
		      uint8_t **ret, size_t *ret_len, struct eng_error *err);
/* RUN_OWN: take the job's bidi call over and answer each request. rf NULL:
 * UNIMPLEMENTED. */
int reflection_serve(const struct reflection *rf, struct job *j, struct eng_error *err);

#endif
