/* test_cpu_budget.c — the default thread count (engines/device/cpu_budget.h)
 * from fake affinity counts and fake cgroup trees (v2 cpu.max, v1
 * cpu.cfs_quota_us), each test in a fresh temporary root. Nothing here
 * depends on the machine: the one test of the real process checks only
 * that the answer is within its affinity mask. */
#include "check_run.h"
#include <check.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/cpu_budget.h"

static char root[256];

static void mkdirs(const char *path)
{
	char buf[1024];

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++)
		if (*p == '/') {
			*p = '\0';
			ck_assert(mkdir(buf, 0755) == 0 || errno == EEXIST);
			*p = '/';
		}
	ck_assert(mkdir(buf, 0755) == 0 || errno == EEXIST);
}

/* Write `text` to root/rel, making its directories. */
static void put(const char *rel, const char *text)
{
	char path[1024], dir[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = '\0';
	mkdirs(dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

static void setup(void)
{
	snprintf(root, sizeof(root), "%s/test-cpu-budget-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(no_cgroup_files)
{
	struct cpu_budget b;

	cpu_budget_read(root, 6, &b);
	ck_assert_int_eq(b.threads, 6);
	ck_assert_int_eq(b.affinity, 6);
	ck_assert(b.quota_cpus == 0);
	ck_assert_str_eq(b.quota_file, "");
	/* A broken affinity count still gives one thread. */
	cpu_budget_read(root, 0, &b);
	ck_assert_int_eq(b.threads, 1);
}
END_TEST

/* cgroup v2: a fractional quota rounds up; the leaf's file is named. */
START_TEST(v2_leaf_quota)
{
	struct cpu_budget b;
	char desc[256];

	put("proc/self/cgroup", "0::/system.slice/engined@0.service\n");
	put("sys/fs/cgroup/system.slice/engined@0.service/cpu.max", "150000 100000\n");
	put("sys/fs/cgroup/system.slice/cpu.max", "max 100000\n");
	cpu_budget_read(root, 8, &b);
	ck_assert_int_eq(b.threads, 2);
	ck_assert_double_eq_tol(b.quota_cpus, 1.5, 1e-9);
	ck_assert_str_eq(b.quota_file, "/sys/fs/cgroup/system.slice/engined@0.service/cpu.max");
	cpu_budget_describe(&b, desc, sizeof(desc));
	ck_assert_str_eq(desc, "2 (affinity 8 CPUs, cgroup quota 1.50 CPUs in "
			 "/sys/fs/cgroup/system.slice/engined@0.service/cpu.max)");
	/* A root given with a trailing slash names the same file. */
	strcat(root, "/");
	cpu_budget_read(root, 8, &b);
	root[strlen(root) - 1] = '\0';
	ck_assert_str_eq(b.quota_file, "/sys/fs/cgroup/system.slice/engined@0.service/cpu.max");
}
END_TEST

/* A parent's quota binds its children: the tightest on the way up wins. */
START_TEST(v2_parent_tighter)
{
	struct cpu_budget b;

	put("proc/self/cgroup", "0::/a/b\n");
	put("sys/fs/cgroup/a/b/cpu.max", "max 100000\n");
	put("sys/fs/cgroup/a/cpu.max", "50000 100000\n");
	put("sys/fs/cgroup/cpu.max", "300000 100000\n");
	cpu_budget_read(root, 4, &b);
	ck_assert_int_eq(b.threads, 1);
	ck_assert_double_eq_tol(b.quota_cpus, 0.5, 1e-9);
	ck_assert_str_eq(b.quota_file, "/sys/fs/cgroup/a/cpu.max");
}
END_TEST

/* A quota above the affinity mask: the mask decides. */
START_TEST(v2_quota_above_affinity)
{
	struct cpu_budget b;

	put("proc/self/cgroup", "0::/\n");
	put("sys/fs/cgroup/cpu.max", "800000 100000\n");
	cpu_budget_read(root, 2, &b);
	ck_assert_int_eq(b.threads, 2);
	ck_assert_double_eq_tol(b.quota_cpus, 8.0, 1e-9);
}
END_TEST

/* A container whose /proc/self/cgroup names the host's path while its
 * /sys/fs/cgroup is its own cgroup: the missing directories are skipped and
 * the mount's root file counts. */
START_TEST(v2_container_root)
{
	struct cpu_budget b;

	put("proc/self/cgroup", "0::/kubepods/burstable/pod1/abc\n");
	put("sys/fs/cgroup/cpu.max", "200000 100000\n");
	cpu_budget_read(root, 16, &b);
	ck_assert_int_eq(b.threads, 2);
	ck_assert_str_eq(b.quota_file, "/sys/fs/cgroup/cpu.max");
}
END_TEST

/* cgroup v1: cfs quota over period, "cpu,cpuacct" mounted under that name;
 * -1 is no limit; other controllers' lines are ignored. */
START_TEST(v1_cfs_quota)
{
	struct cpu_budget b;

	put("proc/self/cgroup", "12:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n"
	    "1:name=systemd:/docker/x\n0::/docker/x\n");
	put("sys/fs/cgroup/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "300000\n");
	put("sys/fs/cgroup/cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000\n");
	put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
	put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
	put("sys/fs/cgroup/memory/docker/x/cpu.cfs_quota_us", "100000\n");
	put("sys/fs/cgroup/memory/docker/x/cpu.cfs_period_us", "100000\n");
	cpu_budget_read(root, 16, &b);
	ck_assert_int_eq(b.threads, 3);
	ck_assert_str_eq(b.quota_file, "/sys/fs/cgroup/cpu,cpuacct/docker/x/cpu.cfs_quota_us");

	put("sys/fs/cgroup/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "-1\n");
	cpu_budget_read(root, 16, &b);
	ck_assert_int_eq(b.threads, 16);
	ck_assert(b.quota_cpus == 0);
}
END_TEST

/* v1 with the cpu controller alone ("1:cpu:/"), as on this project's
 * machines, and a hierarchy mounted only as sys/fs/cgroup/cpu. */
START_TEST(v1_cpu_mount)
{
	struct cpu_budget b;

	put("proc/self/cgroup", "2:cpuacct:/\n1:cpu:/\n0::/\n");
	put("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
	put("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
	cpu_budget_read(root, 2, &b);
	ck_assert_int_eq(b.threads, 2);

	put("proc/self/cgroup", "3:cpuacct,cpu:/job\n");
	put("sys/fs/cgroup/cpu/job/cpu.cfs_quota_us", "100000\n");
	put("sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "50000\n");
	cpu_budget_read(root, 8, &b);
	ck_assert_int_eq(b.threads, 2);
	ck_assert_str_eq(b.quota_file, "/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us");
}
END_TEST

/* v1 and v2 limits at once (a hybrid host): the tighter one. */
START_TEST(hybrid_tighter_wins)
{
	struct cpu_budget b;

	put("proc/self/cgroup", "1:cpu:/j\n0::/j\n");
	put("sys/fs/cgroup/cpu/j/cpu.cfs_quota_us", "400000\n");
	put("sys/fs/cgroup/cpu/j/cpu.cfs_period_us", "100000\n");
	put("sys/fs/cgroup/j/cpu.max", "250000 100000\n");
	cpu_budget_read(root, 32, &b);
	ck_assert_int_eq(b.threads, 3);
	ck_assert_str_eq(b.quota_file, "/sys/fs/cgroup/j/cpu.max");
}
END_TEST

/* Garbage, a zero period and empty files are no limit, never a crash. */
START_TEST(malformed_files)
{
	struct cpu_budget b;

	put("proc/self/cgroup", "garbage\n::\n0::relative\n0::/g\n1:cpu:/g\n");
	put("sys/fs/cgroup/g/cpu.max", "lots of cpu\n");
	put("sys/fs/cgroup/cpu.max", "100000 0\n");
	put("sys/fs/cgroup/cpu/g/cpu.cfs_quota_us", "");
	put("sys/fs/cgroup/cpu/g/cpu.cfs_period_us", "100000\n");
	put("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "0\n");
	put("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
	cpu_budget_read(root, 5, &b);
	ck_assert_int_eq(b.threads, 5);
	ck_assert(b.quota_cpus == 0);
}
END_TEST

/* This process: within its affinity mask, at least one. */
START_TEST(self_within_mask)
{
	struct cpu_budget b;
	cpu_set_t set;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	cpu_budget_self(&b);
	ck_assert_int_eq(b.affinity, CPU_COUNT(&set));
	ck_assert_int_ge(b.threads, 1);
	ck_assert_int_le(b.threads, b.affinity);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu_budget");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, no_cgroup_files);
	tcase_add_test(tc, v2_leaf_quota);
	tcase_add_test(tc, v2_parent_tighter);
	tcase_add_test(tc, v2_quota_above_affinity);
	tcase_add_test(tc, v2_container_root);
	tcase_add_test(tc, v1_cfs_quota);
	tcase_add_test(tc, v1_cpu_mount);
	tcase_add_test(tc, hybrid_tighter_wins);
	tcase_add_test(tc, malformed_files);
	tcase_add_test(tc, self_within_mask);
	suite_add_tcase(s, tc);
	return check_run(s);
}
