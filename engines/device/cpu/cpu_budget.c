/* cpu_budget.c — the CPUs this process may use (cpu_budget.h): affinity
 * mask and cgroup CPU quota, read from files below a root directory so
 * that tests can hand it a fake tree. */
#include <math.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/cpu_budget.h"

#define BUDGET_PATH_MAX 4096

/* Keep the tighter of the current limit and quota/period from `file`. */
static void consider(struct cpu_budget *b, const char *root, const char *file,
		     double quota, double period)
{
	double cpus;

	if (!(quota > 0) || !(period > 0))
		return;
	cpus = quota / period;
	if (b->quota_cpus > 0 && b->quota_cpus <= cpus)
		return;
	b->quota_cpus = cpus;
	/* Below root: the path as the process sees it. */
	snprintf(b->quota_file, sizeof(b->quota_file), "%s",
		 file + strlen(root) - (root[strlen(root) - 1] == '/'));
}

/* v2: "max 100000" (no limit) or "150000 100000". */
static void read_cpu_max(struct cpu_budget *b, const char *root, const char *file)
{
	FILE *f = fopen(file, "r");
	double quota, period;

	if (!f)
		return;
	if (fscanf(f, "%lf %lf", &quota, &period) == 2)
		consider(b, root, file, quota, period);
	fclose(f);
}

static int read_number(const char *file, double *ret)
{
	FILE *f = fopen(file, "r");
	int n;

	if (!f)
		return -1;
	n = fscanf(f, "%lf", ret);
	fclose(f);
	return n == 1 ? 0 : -1;
}

/* v1: cpu.cfs_quota_us (-1: no limit) over cpu.cfs_period_us in `dir`. */
static void read_cfs(struct cpu_budget *b, const char *root, const char *dir)
{
	char q[BUDGET_PATH_MAX + 32], p[BUDGET_PATH_MAX + 32];
	double quota, period;

	snprintf(q, sizeof(q), "%s/cpu.cfs_quota_us", dir);
	snprintf(p, sizeof(p), "%s/cpu.cfs_period_us", dir);
	if (read_number(q, &quota) == 0 && read_number(p, &period) == 0)
		consider(b, root, q, quota, period);
}

/* Each cgroup from `mount`/`path` up to `mount` itself. */
static void walk_up(struct cpu_budget *b, const char *root, const char *mount,
		    const char *path, bool v2)
{
	char dir[BUDGET_PATH_MAX], file[BUDGET_PATH_MAX + 32];
	size_t base;
	char *slash;

	if ((size_t)snprintf(dir, sizeof(dir), "%s%s", mount, path) >= sizeof(dir))
		return;
	base = strlen(mount);
	for (;;) {
		size_t n = strlen(dir);

		while (n > base && dir[n - 1] == '/')
			dir[--n] = '\0';
		if (v2) {
			snprintf(file, sizeof(file), "%s/cpu.max", dir);
			read_cpu_max(b, root, file);
		} else {
			read_cfs(b, root, dir);
		}
		if (n <= base)
			break;
		slash = strrchr(dir + base, '/');
		if (!slash)
			break;
		*slash = '\0';
	}
}

/* Does the comma-separated list `ctrls` name the `cpu` controller? */
static bool has_cpu(const char *ctrls)
{
	const char *p = ctrls;

	while (*p) {
		size_t n = strcspn(p, ",");

		if (n == 3 && strncmp(p, "cpu", 3) == 0)
			return true;
		p += n + (p[n] == ',');
	}
	return false;
}

void cpu_budget_read(const char *root, int affinity, struct cpu_budget *ret)
{
	char file[BUDGET_PATH_MAX], line[BUDGET_PATH_MAX], mount[BUDGET_PATH_MAX];
	const char *sep = root[strlen(root) - 1] == '/' ? "" : "/";
	FILE *f;

	memset(ret, 0, sizeof(*ret));
	ret->affinity = affinity > 0 ? affinity : 1;
	snprintf(file, sizeof(file), "%s%sproc/self/cgroup", root, sep);
	f = fopen(file, "r");
	while (f && fgets(line, sizeof(line), f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		char *path;

		if (!c2)
			continue;
		*c1 = *c2 = '\0';
		path = c2 + 1;
		path[strcspn(path, "\n")] = '\0';
		if (path[0] != '/')
			continue;
		if (strcmp(line, "0") == 0 && c2 == c1 + 1) {
			snprintf(mount, sizeof(mount), "%s%ssys/fs/cgroup", root, sep);
			walk_up(ret, root, mount, path, true);
		} else if (has_cpu(c1 + 1)) {
			/* "cpu,cpuacct" is mounted under its own name; the
			 * "cpu" link or mount is the fallback. */
			snprintf(mount, sizeof(mount), "%s%ssys/fs/cgroup/%s", root, sep, c1 + 1);
			if (access(mount, F_OK) != 0)
				snprintf(mount, sizeof(mount), "%s%ssys/fs/cgroup/cpu", root, sep);
			walk_up(ret, root, mount, path, false);
		}
	}
	if (f)
		fclose(f);
	ret->threads = ret->affinity;
	if (ret->quota_cpus > 0 && ceil(ret->quota_cpus) < ret->threads)
		ret->threads = (int)ceil(ret->quota_cpus);
	if (ret->threads < 1)
		ret->threads = 1;
}

/* CPUs in the affinity mask; the mask is sized up for hosts with more CPUs
 * than a cpu_set_t holds. */
static int affinity_cpus(void)
{
	for (int n = CPU_SETSIZE; n <= (1 << 16); n *= 2) {
		cpu_set_t *set = CPU_ALLOC(n);
		size_t size = CPU_ALLOC_SIZE(n);
		int count;

		if (!set)
			break;
		CPU_ZERO_S(size, set);
		if (sched_getaffinity(0, size, set) == 0) {
			count = CPU_COUNT_S(size, set);
			CPU_FREE(set);
			return count;
		}
		CPU_FREE(set);
	}
	return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

void cpu_budget_self(struct cpu_budget *ret)
{
	cpu_budget_read("/", affinity_cpus(), ret);
}

void cpu_budget_describe(const struct cpu_budget *b, char *buf, size_t len)
{
	if (b->quota_cpus > 0)
		snprintf(buf, len, "%d (affinity %d CPUs, cgroup quota %.2f CPUs in %s)",
			 b->threads, b->affinity, b->quota_cpus, b->quota_file);
	else
		snprintf(buf, len, "%d (affinity %d CPUs, no cgroup CPU quota)",
			 b->threads, b->affinity);
}
