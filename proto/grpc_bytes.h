/* grpc_bytes.h — a received gRPC message as one flat buffer. The one copy
 * of the byte-buffer reading that the daemon's rpc room (daemon/rpc/) and
 * the C client's transport (client/transport_grpc.c) both need; only those
 * two files see gRPC. */
#ifndef ENGINED_GRPC_BYTES_H
#define ENGINED_GRPC_BYTES_H

#include <grpc/byte_buffer.h>
#include <stddef.h>
#include <stdint.h>

/* Copy the message `bb` (decompressed by gRPC's reader when it was
 * compressed) into one malloc'ed buffer: *ret (the caller frees it; at
 * least one byte even for an empty message) and *ret_len. -ENOMEM; -EIO
 * when the reader cannot start or its slices do not add up to the
 * message's length. The outputs are untouched on failure. */
int grpc_bytes_flatten(grpc_byte_buffer *bb, uint8_t **ret, size_t *ret_len);

#endif
