/* enginectl_demo.h — `enginectl demo` (enginectl_demo.c): a short SFT +
 * PPO controller against a running engined. */
#ifndef ENGINED_CLIENT_ENGINECTL_DEMO_H
#define ENGINED_CLIENT_ENGINECTL_DEMO_H

#include "enginectl.h"

/* Its options (for the command table) and the command itself. */
extern const struct ctl_opt ctl_demo_opts[];
int ctl_demo(int argc, char **argv);

#endif
