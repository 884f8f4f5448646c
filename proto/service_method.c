/* service_method.c — method lookup in a service descriptor (see
 * service_method.h). */
#include "service_method.h"

#include <stdio.h>
#include <string.h>

const ProtobufCMethodDescriptor *service_method(const ProtobufCServiceDescriptor *svc,
						const char *package, const char *name,
						char *path, size_t len)
{
	const ProtobufCMethodDescriptor *md = protobuf_c_service_descriptor_get_method_by_name(svc, name);
	int n;

	if (!md || !path)
		return md;
	if (package)
		n = snprintf(path, len, "/%s.%s/%s", package, svc->short_name, md->name);
	else
		n = snprintf(path, len, "/%s/%s", svc->name, md->name);
	return n > 0 && (size_t)n < len ? md : NULL;
}
