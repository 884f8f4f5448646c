/* pb_has.h — presence of the proto's fields written `oneof _x { T x = N; }`
 * (proto3's `optional`, spelled out because protobuf-c 1.4 cannot compile
 * `optional`; see engine.proto's header): protobuf-c keeps a `_x_case`
 * that is 0 while the field is unset. */
#ifndef ENGINED_PROTO_PB_HAS_H
#define ENGINED_PROTO_PB_HAS_H

#define PB_HAS(msg, field) ((msg)->_##field##_case != 0)

#endif
