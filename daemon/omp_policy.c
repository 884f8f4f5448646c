/* omp_policy.c — the OpenMP wait policy, set before libgomp loads by one
 * re-exec of the daemon (omp_policy.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "omp_policy.h"

/* Set by the first run for the second: the policy is ours. */
static bool set_by_us;

static const char *env_or(const char *name, const char *dflt)
{
	const char *v = getenv(name);

	return v ? v : dflt;
}

void omp_policy_apply(char **argv)
{
	if (getenv(OMP_POLICY_MARK)) {
		/* The second run: not passed on to anything we start. */
		set_by_us = true;
		unsetenv(OMP_POLICY_MARK);
		return;
	}
	if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
		return;  /* the operator's choice */
	if (setenv(OMP_POLICY_VAR, OMP_POLICY_VALUE, 1) < 0 ||
	    setenv(OMP_POLICY_MARK, "1", 1) < 0) {
		log_msg(LOG_LVL_WARN, "cannot set %s: %s", OMP_POLICY_VAR, strerror(errno));
		return;
	}
	execv("/proc/self/exe", argv);
	log_msg(LOG_LVL_WARN,
		"cannot re-execute /proc/self/exe to set %s=%s (%s): OpenMP threads spin "
		"while they wait, which slows the engine down on a busy machine",
		OMP_POLICY_VAR, OMP_POLICY_VALUE, strerror(errno));
	unsetenv(OMP_POLICY_VAR);
	unsetenv(OMP_POLICY_MARK);
}

void omp_policy_describe(char *buf, size_t len)
{
	snprintf(buf, len, "OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s (%s)",
		 env_or("OMP_WAIT_POLICY", "unset"), env_or("GOMP_SPINCOUNT", "unset"),
		 set_by_us ? "set by engined before libgomp loaded" :
		 getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") ?
		 "from the environment" : "libgomp's defaults: threads spin while they wait");
}
