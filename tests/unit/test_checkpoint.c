/* test_checkpoint.c — checkpoint directories (engines/checkpoint/):
 * write/open/verify, corruption and missing files, rotation derived from
 * the disk (also across a fresh writer), `latest`, overwriting a name, a
 * writer killed with SIGKILL in the middle of a save, engine_state.json's
 * seal, and symlinks below the directory never followed.
 */
#include "check_run.h"
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint/checkpoint.h"
#include "io/safetensors.h"

/* The base directory is made and removed by the runner (unchecked
 * fixture), so that it goes away even when a test fails; each test works
 * in a fresh subdirectory of it. */
static char base[64];
static char root[96];
static int seq;

static void make_base(void)
{
	strcpy(base, "/tmp/test_ckpt.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
}

static void remove_base(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	ck_assert_int_eq(system(cmd), 0);
}

static void setup(void)
{
	snprintf(root, sizeof(root), "%s/%d-%ld", base, ++seq, (long)getpid());
	ck_assert_int_eq(mkdir(root, 0700), 0);
}

static char *rpath(const char *fmt, const char *a)
{
	static char buf[4][512];
	static int k;
	char rel[256];

	k = (k + 1) % 4;
	snprintf(rel, sizeof(rel), fmt, a);
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, rel);
	return buf[k];
}

static bool exists(const char *path)
{
	struct stat sb;

	return stat(path, &sb) == 0;
}

static void read_text(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	size_t n;

	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	fclose(f);
}

static void spill_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

/* Names in root, sorted, joined by ',' (hidden ones included). */
static void listing(char *out, size_t cap)
{
	struct dirent **ents;
	int n, i;

	out[0] = '\0';
	n = scandir(root, &ents, NULL, alphasort);
	ck_assert_int_ge(n, 0);
	for (i = 0; i < n; i++) {
		if (strcmp(ents[i]->d_name, ".") && strcmp(ents[i]->d_name, "..")) {
			if (out[0])
				strncat(out, ",", cap - strlen(out) - 1);
			strncat(out, ents[i]->d_name, cap - strlen(out) - 1);
		}
		free(ents[i]);
	}
	free(ents);
}

/* Save checkpoint `name` with a 1000-float model filled with `fill`. */
static uint64_t save(const char *name, int64_t step, int max_to_keep, float fill)
{
	static float w[1000];
	int64_t shape[2] = { 10, 100 };
	struct eng_error err = { 0 };
	struct ckpt_writer *cw;
	struct st_writer *sw;
	uint64_t bytes, xxh, total = 0;
	json_t *state;
	int i;

	for (i = 0; i < 1000; i++)
		w[i] = fill + (float)i;
	ck_assert_msg(ckpt_writer_begin(rpath("%s", name), &cw, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(st_writer_new(ckpt_writer_path(cw, "model.safetensors"), &sw, &err), 0);
	ck_assert_int_eq(st_writer_add(sw, "w", ST_F32, 2, shape, w, &err), 0);
	ck_assert_int_eq(st_writer_finish(sw, &bytes, &xxh, &err), 0);
	ck_assert_int_eq(ckpt_writer_record(cw, "model.safetensors", bytes, xxh, &err), 0);
	ck_assert_int_eq(ckpt_writer_put(cw, "config.json", "{\"model_type\":\"llama\"}", 22,
					 &err), 0);
	state = json_pack("{s:I}", "global_step", (json_int_t)step);
	ck_assert_msg(ckpt_writer_commit(cw, state, max_to_keep, &total, &err) == 0, "%s",
		      err.msg);
	json_decref(state);
	return total;
}

/* Open `dir` and check the step and the model contents. */
static void check_open(const char *dir, const char *want_dir, int64_t step, float fill)
{
	struct eng_error err = { 0 };
	struct st_reader *r;
	json_t *state = NULL;
	char *resolved = NULL;
	float w[1000];
	int i;

	ck_assert_msg(ckpt_open(dir, &state, &resolved, NULL, &err) == 0, "%s", err.msg);
	ck_assert_str_eq(resolved, want_dir);
	ck_assert_int_eq(json_integer_value(json_object_get(state, "global_step")), step);
	ck_assert(json_is_object(json_object_get(json_object_get(state, "files"),
						 "model.safetensors")));
	ck_assert_int_eq(st_reader_open(rpath("%s/model.safetensors", strrchr(resolved, '/') + 1),
					&r, &err), 0);
	ck_assert_int_eq(st_reader_read_f32(r, "w", w, 1000, &err), 0);
	for (i = 0; i < 1000; i++)
		ck_assert(w[i] == fill + (float)i);
	st_reader_close(r);
	json_decref(state);
	free(resolved);
}

START_TEST(write_open_verify)
{
	struct eng_error err = { 0 };
	json_t *state, *files;
	char *resolved, text[256], list[512];
	uint64_t total;
	struct stat a, b, c;

	total = save("step_10", 10, 0, 1.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "latest,step_10");   /* no temporary left */
	read_text(rpath("%s", "latest"), text, sizeof(text));
	ck_assert_str_eq(text, "step_10");
	ck_assert_int_eq(stat(rpath("%s/model.safetensors", "step_10"), &a), 0);
	ck_assert_int_eq(stat(rpath("%s/config.json", "step_10"), &b), 0);
	ck_assert_int_eq(stat(rpath("%s/engine_state.json", "step_10"), &c), 0);
	ck_assert_uint_eq(total, (uint64_t)(a.st_size + b.st_size + c.st_size));

	check_open(root, rpath("%s", "step_10"), 10, 1.0f);             /* via latest */
	check_open(rpath("%s", "step_10"), rpath("%s", "step_10"), 10, 1.0f);

	/* engine_state.json records sizes and XXH64 of the files. */
	ck_assert_int_eq(ckpt_open(root, &state, &resolved, NULL, &err), 0);
	files = json_object_get(state, "files");
	ck_assert_int_eq(json_object_size(files), 2);
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(files,
			 "config.json"), "bytes")), 22);
	snprintf(text, sizeof(text), "%016llx",
		 (unsigned long long)XXH64("{\"model_type\":\"llama\"}", 22, 0));
	ck_assert_str_eq(json_string_value(json_object_get(json_object_get(files,
			 "config.json"), "xxh64")), text);
	ck_assert_int_eq(json_integer_value(json_object_get(state, "format_version")),
			 CKPT_FORMAT_VERSION);
	json_decref(state);
	free(resolved);
}
END_TEST

/* ckpt_open_with: done from 0 up to total, never back. */
struct seen_progress {
	int calls;
	uint64_t first, last, total;
	bool back;
};

static void on_verify(void *ctx, uint64_t done, uint64_t total)
{
	struct seen_progress *p = ctx;

	if (p->calls++ == 0)
		p->first = done;
	else if (done < p->last || total != p->total)
		p->back = true;
	p->last = done;
	p->total = total;
}

START_TEST(open_reports_verification)
{
	struct eng_error err = { 0 };
	struct seen_progress seen = { 0 };
	const struct ckpt_open_opts prog = { on_verify, &seen, NULL };
	json_t *state = NULL;
	struct stat a, b;

	save("step_1", 1, 0, 1.0f);
	ck_assert_int_eq(stat(rpath("%s/model.safetensors", "step_1"), &a), 0);
	ck_assert_int_eq(stat(rpath("%s/config.json", "step_1"), &b), 0);
	ck_assert_msg(ckpt_open_with(root, &prog, &state, NULL, NULL, &err) == 0, "%s",
		      err.msg);
	ck_assert_int_ge(seen.calls, 3);        /* 0, then after each file's reads */
	ck_assert(!seen.back);
	ck_assert_uint_eq(seen.first, 0);
	ck_assert_uint_eq(seen.total, (uint64_t)(a.st_size + b.st_size));
	ck_assert_uint_eq(seen.last, seen.total);
	json_decref(state);
}
END_TEST

static bool only_config(void *ctx, json_t *state, const char *name)
{
	(void)ctx;
	ck_assert_ptr_nonnull(json_object_get(state, "files"));
	return !strcmp(name, "config.json");
}

static void flip_byte(const char *path, off_t off);

/* ckpt_open_with's verify filter: a reader of some files checks those
 * only; a corrupt file it does not read is not its concern, a corrupt one
 * it reads is -EBADMSG. */
START_TEST(open_verifies_the_files_asked)
{
	struct eng_error err = { 0 };
	const struct ckpt_open_opts only = { NULL, NULL, only_config };
	json_t *state = NULL;

	save("step_1", 1, 0, 1.0f);
	flip_byte(rpath("%s/model.safetensors", "step_1"), 100);
	ck_assert_msg(ckpt_open_with(root, &only, &state, NULL, NULL, &err) == 0, "%s", err.msg);
	json_decref(state);
	state = NULL;
	ck_assert_int_eq(ckpt_open(root, &state, NULL, NULL, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "model.safetensors"));
	eng_error_clear(&err);
	flip_byte(rpath("%s/config.json", "step_1"), 1);
	ck_assert_int_eq(ckpt_open_with(root, &only, &state, NULL, NULL, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "config.json"));
}
END_TEST

/* Another process's writer: it joins the temporary directory by name,
 * creates its file there, and the writer records and commits it; a name
 * that is not that checkpoint's temporary name is refused, and a file
 * recorded that is not there fails the record. */
START_TEST(join_temp_writes_into_another_writer)
{
	struct eng_error err = { 0 };
	struct ckpt_writer *cw;
	struct st_writer *sw;
	static const float v[4] = { 1, 2, 3, 4 };
	int64_t shape[1] = { 4 };
	uint64_t bytes, xxh, total = 0;
	json_t *state = NULL;
	int fd = -1;

	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "shared"), &cw, &err), 0);
	ck_assert_int_eq(ckpt_join_temp(rpath("%s", "shared"), ".other.tmp-1", &fd, &err), -EINVAL);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_join_temp(rpath("%s", "shared"), "../x", &fd, &err), -EINVAL);
	eng_error_clear(&err);
	ck_assert_msg(ckpt_join_temp(rpath("%s", "shared"), ckpt_writer_temp_name(cw), &fd,
				     &err) == 0, "%s", err.msg);
	ck_assert_int_eq(st_writer_new_at(fd, "part.safetensors", "part", &sw, &err), 0);
	ck_assert_int_eq(st_writer_add(sw, "v", ST_F32, 1, shape, v, &err), 0);
	ck_assert_int_eq(st_writer_finish(sw, &bytes, &xxh, &err), 0);
	close(fd);
	ck_assert_int_eq(ckpt_writer_record(cw, "absent.safetensors", bytes, xxh, &err), -EINVAL);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_writer_record(cw, "part.safetensors", bytes, xxh, &err), 0);
	state = json_pack("{s:I}", "global_step", (json_int_t)1);
	ck_assert_msg(ckpt_writer_commit(cw, state, 0, &total, &err) == 0, "%s", err.msg);
	json_decref(state);
	state = NULL;
	ck_assert_msg(ckpt_open(rpath("%s", "shared"), &state, NULL, NULL, &err) == 0, "%s",
		      err.msg);
	ck_assert_ptr_nonnull(json_object_get(json_object_get(state, "files"),
					      "part.safetensors"));
	json_decref(state);
}
END_TEST

static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	unsigned char c;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &c, 1, off), 1);
	c ^= 0x01;
	ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
	close(fd);
}

START_TEST(corruption_and_missing)
{
	struct eng_error err = { 0 };
	json_t *state = NULL;
	char *resolved = NULL;
	FILE *f;

	save("a", 1, 0, 0.0f);
	/* One flipped bit in the tensor data. */
	flip_byte(rpath("%s/model.safetensors", "a"), 1000);
	ck_assert_int_eq(ckpt_open(root, &state, &resolved, NULL, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "model.safetensors"));
	ck_assert_ptr_null(state);
	ck_assert_ptr_null(resolved);
	flip_byte(rpath("%s/model.safetensors", "a"), 1000);
	ck_assert_int_eq(ckpt_open(root, &state, &resolved, NULL, NULL), 0);
	json_decref(state);
	free(resolved);

	/* A grown file. */
	f = fopen(rpath("%s/config.json", "a"), "a");
	fputc(' ', f);
	fclose(f);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_open(root, &state, &resolved, NULL, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "config.json"));

	/* A listed file that is gone. */
	ck_assert_int_eq(unlink(rpath("%s/config.json", "a")), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_open(rpath("%s", "a"), &state, &resolved, NULL, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "config.json"));

	/* A broken engine_state.json. */
	f = fopen(rpath("%s/engine_state.json", "a"), "w");
	fputs("{\"global_step\": ", f);
	fclose(f);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_open(rpath("%s", "a"), &state, &resolved, NULL, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "engine_state.json"));

	/* Nothing there at all. */
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_open(rpath("%s", "nothing"), &state, &resolved, NULL, &err), -ENOENT);
	/* `latest` naming a checkpoint that does not exist. */
	ck_assert_int_eq(rename(rpath("%s", "a"), rpath("%s", "b")), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_open(root, &state, &resolved, NULL, &err), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err.msg, "/a/engine_state.json"));
}
END_TEST

START_TEST(rotation)
{
	char list[512], text[64];
	struct eng_error err = { 0 };
	struct ckpt_writer *w;

	/* Not checkpoints: never rotated away. */
	ck_assert_int_eq(mkdir(rpath("%s", "notes"), 0755), 0);
	ck_assert_int_eq(mkdir(rpath("%s", "junk"), 0755), 0);
	{
		FILE *f = fopen(rpath("%s/engine_state.json", "junk"), "w");

		fputs("not json", f);
		fclose(f);
	}
	save("step_10", 10, 2, 10.0f);
	save("step_20", 20, 2, 20.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "junk,latest,notes,step_10,step_20");
	save("step_30", 30, 2, 30.0f);
	save("step_40", 40, 2, 40.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "junk,latest,notes,step_30,step_40");
	read_text(rpath("%s", "latest"), text, sizeof(text));
	ck_assert_str_eq(text, "step_40");
	check_open(root, rpath("%s", "step_40"), 40, 40.0f);

	/* "Restart": a fresh writer with nothing in memory; the order comes
	 * from the recorded global_step, not from names or times. */
	save("x_late", 50, 2, 50.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "junk,latest,notes,step_40,x_late");
	/* A save with a lower step (after a rollback) is kept, with the newest
	 * other one. */
	save("step_5", 5, 2, 5.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "junk,latest,notes,step_5,x_late");
	check_open(root, rpath("%s", "step_5"), 5, 5.0f);
	/* max_to_keep <= 0 keeps everything. */
	save("step_60", 60, 0, 60.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "junk,latest,notes,step_5,step_60,x_late");
	save("step_70", 70, 1, 70.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "junk,latest,notes,step_70");

	/* Bad names and parents. */
	ck_assert_int_eq(ckpt_writer_begin("relative/x", &w, &err), -EINVAL);
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "latest"), &w, &err), -EINVAL);
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", ".hidden"), &w, &err), -EINVAL);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "no/parent"), &w, &err), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err.msg, "/no"));
}
END_TEST

START_TEST(overwrite_same_name)
{
	char list[512];
	struct eng_error err = { 0 };
	struct ckpt_writer *w;
	json_t *bad;

	save("best", 1, 0, 1.0f);
	save("best", 2, 0, 2.0f);
	check_open(root, rpath("%s", "best"), 2, 2.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "best,latest");

	/* An aborted overwrite leaves the old one. */
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "best"), &w, &err), 0);
	ck_assert_int_eq(ckpt_writer_put(w, "config.json", "{}", 2, &err), 0);
	ck_assert_int_eq(ckpt_writer_record(w, "config.json", 2, 0, &err), -EINVAL);   /* twice */
	ck_assert_int_eq(ckpt_writer_record(w, "model.safetensors", 5, 0, &err), -EINVAL);
	ck_assert_int_eq(ckpt_writer_put(w, "engine_state.json", "{}", 2, &err), -EINVAL);
	ckpt_writer_abort(w);
	ckpt_writer_abort(NULL);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "best,latest");
	check_open(root, rpath("%s", "best"), 2, 2.0f);
	/* A commit that fails (state not an object) removes its temporary. */
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "best"), &w, &err), 0);
	eng_error_clear(&err);
	bad = json_integer(3);
	ck_assert_int_eq(ckpt_writer_commit(w, bad, 1, NULL, &err), -EINVAL);
	json_decref(bad);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "best,latest");
}
END_TEST

/* A child begins saving `name`, writes half of a file and stops itself;
 * the parent kills it with SIGKILL. Returns the child's pid. */
static pid_t killed_writer(const char *name)
{
	pid_t pid;
	int status;

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ckpt_writer *w;
		static char half[1 << 20];
		int fd;

		if (ckpt_writer_begin(rpath("%s", name), &w, NULL))
			_exit(2);
		fd = open(ckpt_writer_path(w, "model.safetensors"), O_WRONLY | O_CREAT, 0644);
		if (fd < 0 || write(fd, half, sizeof(half)) != (ssize_t)sizeof(half))
			_exit(3);
		raise(SIGSTOP);
		_exit(4);   /* never reached: killed while stopped */
	}
	ck_assert_int_eq(waitpid(pid, &status, WUNTRACED), pid);
	ck_assert_msg(WIFSTOPPED(status), "child status %d", status);
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	return pid;
}

START_TEST(crash_mid_save)
{
	char list[512], tmp[64], live[64], text[4096];
	struct eng_error err = { 0 };
	struct ckpt_writer *w;
	pid_t pid;

	save("step_1", 1, 0, 1.0f);
	save("best", 1, 0, 7.0f);
	save("step_1", 1, 0, 1.0f);   /* latest -> step_1 */

	/* Killed while writing a new checkpoint. */
	pid = killed_writer("step_2");
	snprintf(tmp, sizeof(tmp), ".step_2.tmp-%ld", (long)pid);
	ck_assert(exists(rpath("%s", tmp)));
	ck_assert(!exists(rpath("%s", "step_2")));
	read_text(rpath("%s", "latest"), text, sizeof(text));
	ck_assert_str_eq(text, "step_1");
	check_open(root, rpath("%s", "step_1"), 1, 1.0f);

	/* Killed while overwriting an existing one: the old one is intact.
	 * This writer's begin removed the first one's stale temporary. */
	pid = killed_writer("best");
	check_open(rpath("%s", "best"), rpath("%s", "best"), 1, 7.0f);
	ck_assert(!exists(rpath("%s", tmp)));
	snprintf(tmp, sizeof(tmp), ".best.tmp-%ld", (long)pid);
	ck_assert(exists(rpath("%s", tmp)));

	/* Temporaries that look like complete checkpoints with a high step (a
	 * crash right after an exchange): one of a dead process, one of a live
	 * one (our parent). Neither is opened or counted by rotation; the next
	 * writer removes the dead one's only. */
	snprintf(live, sizeof(live), ".old.tmp-%ld", (long)getppid());
	snprintf(text, sizeof(text), "cd '%s' && cp -r best .old.tmp-999999999 && "
		 "cp -r best %s && sed -i 's/\"global_step\": 1/\"global_step\": 99/' "
		 ".old.tmp-999999999/engine_state.json %s/engine_state.json && "
		 "grep -q '\"global_step\": 99' %s/engine_state.json", root, live, live, live);
	ck_assert_int_eq(system(text), 0);
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "step_3"), &w, &err), 0);
	ck_assert(!exists(rpath("%s", tmp)));
	ck_assert(!exists(rpath("%s", ".old.tmp-999999999")));
	ck_assert(exists(rpath("%s", live)));
	ckpt_writer_abort(w);
	save("step_3", 3, 2, 3.0f);
	listing(list, sizeof(list));
	/* "best" and step_1 both record step 1: the tie goes to the larger name. */
	snprintf(text, sizeof(text), "%s,latest,step_1,step_3", live);
	ck_assert_str_eq(list, text);
	check_open(root, rpath("%s", "step_3"), 3, 3.0f);
}
END_TEST

/* Two writers of this process in the same parent do not remove each
 * other's temporary directory. */
START_TEST(concurrent_writers)
{
	struct eng_error err = { 0 };
	struct ckpt_writer *a, *b, *c = NULL;
	char path[512];

	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "a"), &a, &err), 0);
	snprintf(path, sizeof(path), "%s", ckpt_writer_path(a, "config.json"));
	ck_assert_int_eq(ckpt_writer_put(a, "config.json", "{}", 2, &err), 0);
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "b"), &b, &err), 0);
	ck_assert(exists(path));
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "a"), &c, &err), -EALREADY);
	ck_assert_ptr_null(c);
	ckpt_writer_abort(a);
	ck_assert(!exists(path));
	ckpt_writer_abort(b);
}
END_TEST

/* engine_state.json is sealed: an edit is refused (and such a directory is
 * not a checkpoint for rotation); the library's members are its own. */
START_TEST(state_seal)
{
	struct eng_error err = { 0 };
	struct ckpt_writer *w;
	json_t *state = NULL, *bad;
	char *resolved = NULL, cmd[1024], list[512];

	save("a", 1, 0, 1.0f);
	save("b", 2, 0, 2.0f);
	snprintf(cmd, sizeof(cmd), "sed -i 's/\"global_step\": 1,/\"global_step\": 9,/' "
		 "'%s/a/engine_state.json' && "
		 "grep -q '\"global_step\": 9' '%s/a/engine_state.json'", root, root);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(ckpt_open(rpath("%s", "a"), &state, &resolved, NULL, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "a/engine_state.json"));
	ck_assert_ptr_nonnull(strstr(err.msg, "state_xxh64"));
	/* "a" (step 9 by its text) is not a checkpoint: kept by a rotation to
	 * 1 that removes "b". */
	save("c", 3, 1, 3.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "a,c,latest");
	/* Whitespace is not covered: re-indented, the file still opens. */
	snprintf(cmd, sizeof(cmd), "sed -i 's/^  /\\t/' '%s/c/engine_state.json'", root);
	ck_assert_int_eq(system(cmd), 0);
	check_open(rpath("%s", "c"), rpath("%s", "c"), 3, 3.0f);
	/* The library's members are not the caller's to give. */
	ck_assert_int_eq(ckpt_writer_begin(rpath("%s", "d"), &w, &err), 0);
	bad = json_pack("{s:i, s:{}}", "global_step", 1, "files");
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_writer_commit(w, bad, 0, NULL, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "'files'"));
	json_decref(bad);
	ck_assert(!exists(rpath("%s", "d")));
	ck_assert(ckpt_reserved_key("state_xxh64") && ckpt_reserved_key("format_version"));
	ck_assert(!ckpt_reserved_key("global_step"));
	ck_assert(ckpt_hex64("0123456789abcdef", NULL));
	ck_assert(!ckpt_hex64("0123456789ABCDEF", NULL) && !ckpt_hex64("0123", NULL));
}
END_TEST

/* Below the directory given, nothing is followed through a symlink:
 * `latest` or its entry, a listed file; removal and rotation never touch a
 * symlink's target. */
START_TEST(symlinks_below)
{
	struct eng_error err = { 0 };
	json_t *state = NULL;
	char *resolved = NULL, cmd[2048], list[512], out[160];

	snprintf(out, sizeof(out), "%s-outside", root);
	save("real", 1, 0, 1.0f);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir '%s' && cp -r '%s/real' '%s/ck' && "
		 "printf real > '%s/latest-file' && cd '%s' && "
		 "find . -type f | sort | xargs sha256sum > '%s.sums'", out, out, root, out, out,
		 out, out);
	ck_assert_int_eq(system(cmd), 0);
	/* The entry `latest` names is a symlink to a valid checkpoint. */
	ck_assert_int_eq(unlink(rpath("%s", "latest")), 0);
	spill_text(rpath("%s", "latest"), "link");
	snprintf(cmd, sizeof(cmd), "%s/ck", out);
	ck_assert_int_eq(symlink(cmd, rpath("%s", "link")), 0);
	ck_assert_int_eq(ckpt_open(root, &state, &resolved, NULL, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "/link"));
	/* `latest` itself a symlink. */
	ck_assert_int_eq(unlink(rpath("%s", "latest")), 0);
	snprintf(cmd, sizeof(cmd), "%s/latest-file", out);
	ck_assert_int_eq(symlink(cmd, rpath("%s", "latest")), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(ckpt_open(root, &state, &resolved, NULL, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "/latest"));
	/* Each file a symlink to its copy outside. */
	for (int i = 0; i < 3; i++) {
		static const char *const files[] = {"model.safetensors", "config.json",
						    "engine_state.json"};

		snprintf(cmd, sizeof(cmd), "rm -rf '%s/f' && cp -r '%s/real' '%s/f' && "
			 "ln -sf '%s/ck/%s' '%s/f/%s'", root, root, root, out, files[i], root,
			 files[i]);
		ck_assert_int_eq(system(cmd), 0);
		eng_error_clear(&err);
		ck_assert_int_eq(ckpt_open(rpath("%s", "f"), &state, &resolved, NULL, &err),
				 -EPERM);
		ck_assert_msg(strstr(err.msg, files[i]) && strstr(err.msg, "symlink"), "%s",
			      err.msg);
	}
	/* Overwriting f (holding a symlink) and rotating with a symlink to a
	 * checkpoint outside in the parent: nothing outside changes; the
	 * symlinks are replaced, removed or left, never followed. */
	save("f", 5, 0, 5.0f);
	save("g", 6, 1, 6.0f);
	listing(list, sizeof(list));
	ck_assert_str_eq(list, "g,latest,link");
	snprintf(cmd, sizeof(cmd), "cd '%s' && find . -type f | sort | xargs sha256sum | "
		 "cmp -s - '%s.sums'", out, out);
	ck_assert_msg(system(cmd) == 0, "a file outside changed");
	check_open(root, rpath("%s", "g"), 6, 6.0f);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s.sums'", out, out);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("checkpoint");
	TCase *tc = tcase_create("core");

	tcase_add_unchecked_fixture(tc, make_base, remove_base);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, write_open_verify);
	tcase_add_test(tc, open_reports_verification);
	tcase_add_test(tc, open_verifies_the_files_asked);
	tcase_add_test(tc, join_temp_writes_into_another_writer);
	tcase_add_test(tc, corruption_and_missing);
	tcase_add_test(tc, rotation);
	tcase_add_test(tc, overwrite_same_name);
	tcase_add_test(tc, crash_mid_save);
	tcase_add_test(tc, concurrent_writers);
	tcase_add_test(tc, state_seal);
	tcase_add_test(tc, symlinks_below);
	suite_add_tcase(s, tc);
	return check_run(s);
}
