/* safetensors.h — reader and writer of the safetensors format
 * (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
 * length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
 * {str: str}}, then the raw little-endian data. Supported dtypes F32, BF16,
 * F16 (read and written); others are refused with -EINVAL naming the tensor.
 * Also reads sharded checkpoints through model.safetensors.index.json.
 */
#ifndef ENGINED_IO_SAFETENSORS_H
#define ENGINED_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../err.h"

enum st_dtype {
	ST_F32 = 0,
	ST_BF16 = 1,
	ST_F16 = 2,
};

size_t st_dtype_size(enum st_dtype dt);
const char *st_dtype_name(enum st_dtype dt);   /* "F32", "BF16", "F16" */

#define ST_MAX_DIMS 8

struct st_tensor_info {
	char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	uint64_t offset;      /* byte offset of the data from the start of the file */
	uint64_t nbytes;
	int file;             /* index into the reader's files (sharded) */
};

/* --- reading ----------------------------------------------------------- */

struct st_reader;

/* Open a single .safetensors file, or a directory: the directory's
 * model.safetensors.index.json when present (all shards), else its
 * model.safetensors. Header errors (bad length, bad JSON, offsets outside
 * the file or overlapping, shape/size mismatch): -EBADMSG naming the file.
 * Missing file: -ENOENT. The caller owns *ret (st_reader_close).
 * Files are opened with io_openat (fileio.h): a directory is taken as
 * named, but the file, or a directory's index and shards, is never a
 * symlink: -EPERM naming it. */
int st_reader_open(const char *path, struct st_reader **ret, struct eng_error *err);
/* The same for `rel` (a file or a directory; "." the directory itself)
 * beneath the directory descriptor dirfd, with no symlink in any
 * component; `shown` names rel in messages. */
int st_reader_open_at(int dirfd, const char *rel, const char *shown, struct st_reader **ret,
		      struct eng_error *err);
void st_reader_close(struct st_reader *r);     /* accepts NULL */

int st_reader_count(const struct st_reader *r);
const struct st_tensor_info *st_reader_tensor(const struct st_reader *r, int i);
/* NULL when absent. */
const struct st_tensor_info *st_reader_find(const struct st_reader *r, const char *name);
/* Value of a "__metadata__" key of the first file, or NULL. */
const char *st_reader_metadata(const struct st_reader *r, const char *key);

/* Large tensor reads (1 MiB and up) split over `threads` threads
 * (default 1; <= 0 means 1). */
void st_reader_set_threads(struct st_reader *r, int threads);

/* Read tensor `name` converted to fp32 into dst[numel]. -ENOENT when absent,
 * -EINVAL when its element count differs from numel, -EIO on read errors. */
int st_reader_read_f32(struct st_reader *r, const char *name, float *dst,
		       int64_t numel, struct eng_error *err);
/* Elements [first, first + count) of tensor `name` (its flat order)
 * converted to fp32 into dst[count]: a range outside the tensor is
 * -EINVAL; otherwise as st_reader_read_f32. */
int st_reader_read_f32_range(struct st_reader *r, const char *name, int64_t first,
			     int64_t count, float *dst, struct eng_error *err);

/* --- writing ----------------------------------------------------------- */

struct st_writer;

/* Start a file at `path` (created/truncated, mode 0644; never through a
 * symlink: -EPERM; the directory part is taken as named). Tensors are added
 * with st_writer_add (the data is borrowed until st_writer_finish), metadata
 * with st_writer_meta; st_writer_finish writes header + data, fsyncs the
 * file, reports the bytes written and the XXH64 of the whole file, and frees
 * the writer whether it succeeds or not. */
int st_writer_new(const char *path, struct st_writer **ret, struct eng_error *err);
/* The same for `rel` beneath the directory descriptor dirfd (io_openat: no
 * symlink in any component), `shown` in messages. dirfd is duplicated. */
int st_writer_new_at(int dirfd, const char *rel, const char *shown, struct st_writer **ret,
		     struct eng_error *err);
int st_writer_add(struct st_writer *w, const char *name, enum st_dtype stored,
		  int ndim, const int64_t *shape, const float *data_f32,
		  struct eng_error *err);
/* The same for data already in the stored dtype (little-endian bits, e.g.
 * bf16 as received from the daemon), written as it is: nbytes must be
 * st_dtype_size(stored) x the element count. */
int st_writer_add_raw(struct st_writer *w, const char *name, enum st_dtype stored,
		      int ndim, const int64_t *shape, const void *data, uint64_t nbytes,
		      struct eng_error *err);
/* The same with the fp32 data made by fill(ctx, dst[numel]) when
 * st_writer_finish writes the tensor (in the file's order; one such
 * tensor in memory at a time): a tensor that is never whole in memory
 * before, e.g. gathered from a group's ranks. fill's failure fails the
 * finish. */
int st_writer_add_fill(struct st_writer *w, const char *name, enum st_dtype stored,
		       int ndim, const int64_t *shape,
		       int (*fill)(void *ctx, float *dst, uint64_t numel, struct eng_error *err),
		       void *ctx, struct eng_error *err);
int st_writer_meta(struct st_writer *w, const char *key, const char *value,
		   struct eng_error *err);
int st_writer_finish(struct st_writer *w, uint64_t *ret_bytes,
		     uint64_t *ret_xxh64, struct eng_error *err);
void st_writer_abort(struct st_writer *w);     /* accepts NULL; removes the file */
/* Called by st_writer_finish after each tensor's data is written, with the
 * tensor data bytes written so far (the header not counted). */
void st_writer_set_progress(struct st_writer *w, void (*fn)(void *ctx, uint64_t data_bytes),
			    void *ctx);

/* --- conversions (host) ------------------------------------------------ */

/* fp32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN. */
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
/* fp32 -> IEEE binary16 bits, round to nearest even, overflow to inf. */
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
/* The same conversions over arrays (vectorized; src and dst must not
 * overlap). */
void f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
void bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
void f16_to_f32_n(const uint16_t *src, float *dst, size_t n);

/* XXH64 (seed 0) of a whole file, streaming; the file is opened with
 * io_open_file (never through a symlink: -EPERM). */
int file_xxh64(const char *path, uint64_t *ret, struct eng_error *err);
/* The same from the start of the open descriptor fd (not closed), `shown`
 * in messages. */
int fd_xxh64(int fd, const char *shown, uint64_t *ret, struct eng_error *err);
/* The same, calling fn(ctx, bytes hashed so far) after each read (fn may
 * be NULL). */
int fd_xxh64_progress(int fd, const char *shown, void (*fn)(void *ctx, uint64_t bytes),
		      void *ctx, uint64_t *ret, struct eng_error *err);

#endif
