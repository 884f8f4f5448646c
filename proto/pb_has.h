/* pb_has.h — presence of the proto's fields written `oneof _x { T x = N; }`
 * (proto3's `optional`, spelled out because protobuf-c 1.4 cannot compile
 * `optional`; see engine.proto's header): protobuf-c keeps a `_x_case`
 * that is 0 while the field is unset and the field's number once set. */
#ifndef ENGINED_PROTO_PB_HAS_H
#define ENGINED_PROTO_PB_HAS_H

#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#define PB_HAS(msg, field) ((msg)->_##field##_case != 0)

/* Mark the field `name` of m as set (its number into its case member),
 * found through the descriptor: no field number is typed by hand. */
static inline void pb_mark_set(ProtobufCMessage *m, const char *name)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);

	if (f && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
		*(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
}

/* Set a presence field: PB_SET(&opt, lr, 1e-4). */
#define PB_SET(msg, field, value) \
	((msg)->field = (value), pb_mark_set(&(msg)->base, #field))

#endif
