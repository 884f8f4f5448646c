/* nccl_stub.c — the nccl entry of the backend table when this build has no
 * nccl (meson found no nccl.h / libnccl): a NULL name keeps it out of the table. */
#include "dist/dist.h"

const struct dist_ops nccl_dist_ops = { .name = NULL };
