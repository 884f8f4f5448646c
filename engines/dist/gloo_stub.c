/* gloo_stub.c — the gloo entry of the backend table when this build has no
 * gloo (meson found no libgloo): a NULL name keeps it out of the table. */
#include "dist/dist.h"

const struct dist_ops gloo_dist_ops = { .name = NULL };
