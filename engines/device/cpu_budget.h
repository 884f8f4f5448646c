/* cpu_budget.h — how many CPUs this process may use: the CPUs of its
 * affinity mask, and no more than its cgroup's CPU quota allows.
 *
 * The default thread count of the CPU device (and so of the daemon's
 * `[engine] threads = 0`): threads = min(affinity CPUs, ceil(quota / period))
 * over every cgroup from the process's own up to the root, so that a
 * container limited to 1.5 CPUs of a 64-core host runs 2 threads, not 64
 * that the kernel throttles in turn (docs/PERF.md, "under load").
 *
 * Where the quota is read (below `root`, "/" outside tests):
 *   proc/self/cgroup       "0::/path" (cgroup v2) and "N:cpu,...:/path" (v1)
 *   v2: sys/fs/cgroup/<path>/cpu.max, then each parent's, up to
 *       sys/fs/cgroup/cpu.max ("max PERIOD" or "QUOTA PERIOD")
 *   v1: sys/fs/cgroup/<controllers>/<path>/cpu.cfs_quota_us and
 *       cpu.cfs_period_us (or under sys/fs/cgroup/cpu/), each parent's too
 *       (a quota of -1: none)
 * Walking up to the mount's root also covers a container whose
 * /proc/self/cgroup names the host's path while its /sys/fs/cgroup is its
 * own cgroup: the files that do not exist are skipped. Unreadable or
 * malformed files count as no limit.
 */
#ifndef ENGINED_CPU_BUDGET_H
#define ENGINED_CPU_BUDGET_H

#include <stddef.h>

struct cpu_budget {
	int affinity;            /* CPUs in the affinity mask (as given) */
	double quota_cpus;       /* the tightest quota / period; 0: no quota */
	char quota_file[512];    /* the file it came from ("" when none), below root */
	int threads;             /* min(affinity, ceil(quota_cpus)), at least 1 */
};

/* The budget of a process with `affinity` CPUs in its mask whose cgroup
 * files lie below `root` (a directory; "/" for this process). Fills
 * *ret; never fails (missing files mean no quota). */
void cpu_budget_read(const char *root, int affinity, struct cpu_budget *ret);

/* The calling process's budget: sched_getaffinity() (all online CPUs when
 * it fails) and the files below "/". */
void cpu_budget_self(struct cpu_budget *ret);

/* For the log: "2 (affinity 4 CPUs, cgroup quota 1.50 CPUs in
 * /sys/fs/cgroup/x/cpu.max)". */
void cpu_budget_describe(const struct cpu_budget *b, char *buf, size_t len);

#endif
