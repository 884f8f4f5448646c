/* service_method.h — RPC method paths and message types taken from
 * protobuf-c's generated service descriptors, so that neither the daemon
 * nor the C client types a method path or a message type by hand. */
#ifndef ENGINED_PROTO_SERVICE_METHOD_H
#define ENGINED_PROTO_SERVICE_METHOD_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

/* The method `name` of `svc` (NULL when it has none). When `path` is not
 * NULL, also write "/<package>.<Service>/<name>" there (package: NULL for
 * the service's own; another one serves the same messages under a second
 * name, as grpc.reflection.v1alpha does v1's); NULL too when it does not
 * fit in `len`. */
const ProtobufCMethodDescriptor *service_method(const ProtobufCServiceDescriptor *svc,
						const char *package, const char *name,
						char *path, size_t len);

#endif
