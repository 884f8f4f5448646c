/* grpc_bytes.c — a received gRPC message as one flat buffer (grpc_bytes.h). */
#include "grpc_bytes.h"

#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdlib.h>
#include <string.h>

int grpc_bytes_flatten(grpc_byte_buffer *bb, uint8_t **ret, size_t *ret_len)
{
	grpc_byte_buffer_reader rd;
	grpc_slice s;
	size_t len = grpc_byte_buffer_length(bb), off = 0;
	uint8_t *buf = malloc(len ? len : 1);

	if (!buf)
		return -ENOMEM;
	if (!grpc_byte_buffer_reader_init(&rd, bb)) {
		free(buf);
		return -EIO;
	}
	while (grpc_byte_buffer_reader_next(&rd, &s)) {
		size_t n = GRPC_SLICE_LENGTH(s);

		if (off <= len && n <= len - off)
			memcpy(buf + off, GRPC_SLICE_START_PTR(s), n);
		off += n;
		grpc_slice_unref(s);
	}
	grpc_byte_buffer_reader_destroy(&rd);
	if (off != len) {
		free(buf);
		return -EIO;
	}
	*ret = buf;
	*ret_len = len;
	return 0;
}
