/* fuzz_util.h — helpers shared by the libFuzzer harnesses of tests/fuzz/:
 * a scratch directory made once per process (under $TMPDIR, which
 * run_fuzz.sh points at its own folder and empties) and removed at exit,
 * whole-file writes, and a NUL-terminated copy of an input. */
#ifndef ENGINED_FUZZ_UTIL_H
#define ENGINED_FUZZ_UTIL_H

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Stop the process: a harness set-up error, or a broken invariant (the
 * fuzzer records the input as a crash). */
#define FUZZ_CHECK(cond, ...) do {                                          \
		if (!(cond)) {                                              \
			fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                       \
			fputc('\n', stderr);                                \
			abort();                                            \
		}                                                           \
	} while (0)

static char fuzz_scratch[PATH_MAX];

static int fuzz_rm_one(const char *p, const struct stat *sb, int type, struct FTW *f)
{
	(void)sb; (void)type; (void)f;
	return remove(p);
}

static void fuzz_scratch_remove(void)
{
	if (fuzz_scratch[0])
		(void)nftw(fuzz_scratch, fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The process's scratch directory (made on the first call). */
static inline const char *fuzz_scratch_dir(void)
{
	const char *tmp = getenv("TMPDIR");

	if (fuzz_scratch[0])
		return fuzz_scratch;
	snprintf(fuzz_scratch, sizeof(fuzz_scratch), "%s/engined-fuzz-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	FUZZ_CHECK(mkdtemp(fuzz_scratch), "mkdtemp %s", fuzz_scratch);
	atexit(fuzz_scratch_remove);
	return fuzz_scratch;
}

/* dir/name (static buffer of the caller). */
static inline void fuzz_join(char *out, size_t n, const char *dir, const char *name)
{
	FUZZ_CHECK((size_t)snprintf(out, n, "%s/%s", dir, name) < n, "path too long");
}

static inline void fuzz_mkdir(const char *path)
{
	FUZZ_CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
}

/* Replace the file at path with data[len]. */
static inline void fuzz_write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	const char *p = data;

	FUZZ_CHECK(fd >= 0, "open %s", path);
	while (len) {
		ssize_t w = write(fd, p, len);

		FUZZ_CHECK(w > 0, "write %s", path);
		p += w;
		len -= (size_t)w;
	}
	FUZZ_CHECK(close(fd) == 0, "close %s", path);
}

/* A malloc'ed NUL-terminated copy of data[len] (the caller frees). */
static inline char *fuzz_strndup(const uint8_t *data, size_t len)
{
	char *s = malloc(len + 1);

	FUZZ_CHECK(s, "out of memory");
	memcpy(s, data, len);
	s[len] = '\0';
	return s;
}

#endif
