/* wire_check.h — string fields checked on the wire, before protobuf-c
 * unpacks a request: protobuf-c keeps a string's bytes as a C string, so a
 * NUL inside one would silently cut it ("nul\0/../../evil" read as "nul"),
 * and it does not check UTF-8 (a reply echoing such a string cannot be
 * parsed by other clients). Every string field, in nested messages and map
 * entries too, must be valid UTF-8 without NUL. */
#ifndef ENGINED_DAEMON_WIRE_CHECK_H
#define ENGINED_DAEMON_WIRE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "err.h"

/* 0, or -EINVAL naming the field ("loss.name", "contents[1]"). A message
 * malformed otherwise is left for protobuf-c's unpack to refuse (0). */
int wire_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
		       struct eng_error *err);

#endif
