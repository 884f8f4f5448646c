/* omp_policy.h — the OpenMP wait policy of the engine's threads.
 *
 * The CPU device's kernels and oneDNN's matmuls run on libgomp's one thread
 * pool. Between parallel regions libgomp's threads wait; by default they
 * spin for ~300000 iterations (a few ms) first. On a machine shared with
 * other work that spinning takes the CPU from the thread the team waits
 * for, and a step slows down far more than the CPU it loses (docs/PERF.md,
 * "under load"). engined therefore runs with OMP_WAIT_POLICY=passive: a
 * waiting thread sleeps in the kernel (futex) at once, and a thread the
 * team waits for gets the CPU. A bounded spin (GOMP_SPINCOUNT=10000) was
 * measured too and was slower both quiet and loaded on the shared 2-core
 * machines (docs/PERF.md). LLVM's libomp (the clang sanitizer build) reads
 * OMP_WAIT_POLICY as well.
 *
 * libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is loaded,
 * before main(): setting them in main is too late. So when neither is set,
 * the daemon sets OMP_WAIT_POLICY=passive and re-executes itself once
 * (/proc/self/exe, the same arguments and PID: systemd's MAINPID and
 * NOTIFY_SOCKET still hold), marking the environment with OMP_POLICY_MARK,
 * which the second run removes. When the operator has set either variable,
 * it is left as it is (OMP_WAIT_POLICY=active, or GOMP_SPINCOUNT=300000 for
 * libgomp's default, restores spinning). A failed exec is logged and the
 * daemon goes on with libgomp's defaults.
 */
#ifndef ENGINED_DAEMON_OMP_POLICY_H
#define ENGINED_DAEMON_OMP_POLICY_H

#include <stdbool.h>
#include <stddef.h>

#define OMP_POLICY_VAR "OMP_WAIT_POLICY"
#define OMP_POLICY_VALUE "passive"
#define OMP_POLICY_MARK "ENGINED_OMP_POLICY_SET"

/* Call before any thread exists. Returns only when no re-exec is needed
 * (the variables are in place, set by the operator or by an earlier run),
 * or when the exec failed (logged as a warning). */
void omp_policy_apply(char **argv);

/* The effective variables and where they came from, for the start-up log:
 * "OMP_WAIT_POLICY=passive (set by engined)". */
void omp_policy_describe(char *buf, size_t len);

#endif
