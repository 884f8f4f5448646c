/* safetensors.c — reader and writer of the safetensors format (see
 * safetensors.h and https://huggingface.co/docs/safetensors).
 *
 * Reading validates the header the way the reference implementation does:
 * header length at most 100,000,000 bytes, a JSON object (duplicate keys
 * refused), every tensor with dtype/shape/data_offsets whose byte range
 * matches dtype x shape, and the ranges — relative to the first byte after
 * the header — covering the data buffer exactly: no overlap, no hole, no
 * byte past the end of the file. Tensors of dtypes other than F32/BF16/F16
 * are validated but not exposed (reading one is -EINVAL naming it).
 *
 * Writing reproduces the reference writer byte for byte: tensors ordered by
 * dtype (F32, BF16, F16) and then by name, compact JSON with
 * "__metadata__" first (its keys sorted), the header padded with spaces to a
 * multiple of 8 bytes, data contiguous. Data goes out in large writes; bf16
 * and f16 are converted through one bounded buffer, never a copy of the
 * whole model; data added with st_writer_add_raw (already in the stored
 * dtype) is written as it is. The XXH64 of the file is computed over the
 * bytes as they are written.
 */
#include "io/safetensors.h"
#include "io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* The reference implementation's limit (safetensors MAX_HEADER_SIZE). */
#define ST_MAX_HEADER 100000000ull
/* Staging buffer of the writer: small tensors are gathered and 16-bit
 * conversions are done here; f32 tensors larger than half of it are
 * written straight from the caller's memory (see struct st_out). */
#define ST_WBUF (4u << 20)
#define ST_CHUNK (1u << 20)             /* hash + write() granularity */
#define ST_SYNC_WINDOW (32ull << 20)    /* writeback pacing */
#define ST_PAGE 4096u
/* Elements widened per block when reading 16-bit data (stack, 4 KiB). */
#define ST_WIDEN_BLOCK 2048
/* Largest count handed to one read()/write() (Linux caps at 0x7ffff000). */
#define ST_IO_MAX ((size_t)1 << 30)

/* qsort and bsearch over tables that may be empty, and then NULL: the C
 * library declares their pointers nonnull even for zero elements. */
static void sort_table(void *base, size_t n, size_t size,
		       int (*cmp)(const void *, const void *))
{
	if (n > 1)
		qsort(base, n, size, cmp);
}

static void *find_in_table(const void *key, const void *base, size_t n, size_t size,
			   int (*cmp)(const void *, const void *))
{
	return n ? bsearch(key, base, n, size, cmp) : NULL;
}

size_t st_dtype_size(enum st_dtype dt)
{
	switch (dt) {
	case ST_F32: return 4;
	case ST_BF16: return 2;
	case ST_F16: return 2;
	}
	return 0;
}

const char *st_dtype_name(enum st_dtype dt)
{
	switch (dt) {
	case ST_F32: return "F32";
	case ST_BF16: return "BF16";
	case ST_F16: return "F16";
	}
	return "?";
}

/* Every dtype of the format, so that files holding other tensors (int
 * buffers, fp8) still validate; `st` < 0 marks the ones not supported. */
static const struct {
	const char *name;
	unsigned bits;
	int st;
} st_all_dtypes[] = {
	{ "F32", 32, ST_F32 }, { "BF16", 16, ST_BF16 }, { "F16", 16, ST_F16 },
	{ "F64", 64, -1 }, { "I64", 64, -1 }, { "U64", 64, -1 },
	{ "I32", 32, -1 }, { "U32", 32, -1 }, { "I16", 16, -1 },
	{ "U16", 16, -1 }, { "I8", 8, -1 }, { "U8", 8, -1 },
	{ "BOOL", 8, -1 }, { "F8_E5M2", 8, -1 }, { "F8_E4M3", 8, -1 },
	{ "F8_E8M0", 8, -1 }, { "C64", 64, -1 }, { "F6_E2M3", 6, -1 },
	{ "F6_E3M2", 6, -1 }, { "F4", 4, -1 },
};

/* --- reading ----------------------------------------------------------- */

struct st_file {
	char *path;
	int fd;
};

/* A tensor of a dtype this library does not convert. */
struct st_other {
	char *name;
	const char *dtype;   /* static string from st_all_dtypes */
	int file;
};

struct st_reader {
	struct st_file *files;
	int nfiles;
	struct st_tensor_info *tensors;  /* sorted by name */
	int ntensors, cap_tensors;
	struct st_other *others;         /* sorted by name */
	int nothers, cap_others;
	json_t *metadata;                /* "__metadata__" of file 0, or NULL */
	int threads;                     /* st_reader_set_threads; 1 by default */
};

/* Data range of one tensor during validation of a file. */
struct st_range {
	uint64_t begin, end;
	const char *name;
};

/* Read exactly len bytes at off. Returns 0, eng_errno_code(errno), or -EBADMSG when
 * the file ends first (it shrank under us). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;

	while (len) {
		size_t chunk = len < ST_IO_MAX ? len : ST_IO_MAX;
		ssize_t n = pread(fd, p, chunk, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return eng_errno_code(errno);
		if (n == 0)
			return -EBADMSG;
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

/* A read of at least this many bytes is split over the reader's threads:
 * from the page cache (a checkpoint just verified, so its pages are
 * cached) one thread copies ~5.6 GB/s here, two ~10.5. */
#define ST_PARALLEL_MIN ((size_t)1 << 20)
#define ST_MAX_THREADS 64

struct pread_part {
	int fd;
	char *buf;
	size_t len;
	uint64_t off;
	int rc;
};

static void *pread_part_main(void *arg)
{
	struct pread_part *p = arg;

	p->rc = pread_full(p->fd, p->buf, p->len, p->off);
	return NULL;
}

/* pread_full over `threads` threads (this one included), each a
 * contiguous part; the first error in part order is returned. A thread
 * that cannot start leaves its part to this one. */
static int pread_parallel(int fd, void *buf, size_t len, uint64_t off, int threads)
{
	struct pread_part parts[ST_MAX_THREADS];
	pthread_t tid[ST_MAX_THREADS];
	bool started[ST_MAX_THREADS] = { false };
	size_t step;
	int n, rc = 0;

	n = threads < ST_MAX_THREADS ? threads : ST_MAX_THREADS;
	if (n <= 1 || len < ST_PARALLEL_MIN)
		return pread_full(fd, buf, len, off);
	step = ((len + (size_t)n - 1) / (size_t)n + 4095) & ~(size_t)4095;   /* covers len */
	for (int i = 0; i < n; i++) {
		size_t lo = (size_t)i * step < len ? (size_t)i * step : len;
		size_t hi = lo + step < len ? lo + step : len;

		parts[i] = (struct pread_part){ fd, (char *)buf + lo, hi - lo, off + lo, 0 };
	}
	for (int i = 1; i < n; i++)
		started[i] = pthread_create(&tid[i], NULL, pread_part_main, &parts[i]) == 0;
	pread_part_main(&parts[0]);
	for (int i = 1; i < n; i++) {
		if (started[i])
			pthread_join(tid[i], NULL);
		else
			pread_part_main(&parts[i]);
	}
	for (int i = 0; i < n && !rc; i++)
		rc = parts[i].rc;
	return rc;
}

void st_reader_set_threads(struct st_reader *r, int threads)
{
	r->threads = threads > 0 ? threads : 1;
}

static int cmp_info_name(const void *a, const void *b)
{
	const struct st_tensor_info *x = a, *y = b;

	return strcmp(x->name, y->name);
}

static int cmp_other_name(const void *a, const void *b)
{
	const struct st_other *x = a, *y = b;

	return strcmp(x->name, y->name);
}

static int cmp_range(const void *a, const void *b)
{
	const struct st_range *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

void st_reader_close(struct st_reader *r)
{
	int i;

	if (!r)
		return;
	for (i = 0; i < r->nfiles; i++) {
		if (r->files[i].fd >= 0)
			close(r->files[i].fd);
		free(r->files[i].path);
	}
	for (i = 0; i < r->ntensors; i++)
		free(r->tensors[i].name);
	for (i = 0; i < r->nothers; i++)
		free(r->others[i].name);
	free(r->files);
	free(r->tensors);
	free(r->others);
	json_decref(r->metadata);
	free(r);
}

static int grow(void **arr, int *cap, int need, size_t elem)
{
	void *p;
	int ncap;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap * 2 : 64;
	while (ncap < need)
		ncap *= 2;
	p = realloc(*arr, (size_t)ncap * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

static int json_get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* Validate one tensor entry of file `fi` and append it to the reader. Its
 * data range goes to *rg (begin/end relative to the data buffer). */
static int parse_tensor(struct st_reader *r, int fi, const char *name, json_t *t,
			uint64_t data_start, struct st_range *rg, struct eng_error *err)
{
	const char *path = r->files[fi].path;
	json_t *jdt = json_object_get(t, "dtype");
	json_t *jshape = json_object_get(t, "shape");
	json_t *joff = json_object_get(t, "data_offsets");
	const char *dts;
	int64_t shape[ST_MAX_DIMS];
	uint64_t numel = 1, begin, end, nbits;
	unsigned bits = 0;
	int st = -1;
	size_t i, k, ndim;
	char *copy;

	if (!json_is_object(t))
		return eng_fail(err, -EBADMSG, "%s: tensor '%s': header entry is not an object",
				path, name);
	if (!json_is_string(jdt))
		return eng_fail(err, -EBADMSG, "%s: tensor '%s': missing or non-string dtype",
				path, name);
	dts = json_string_value(jdt);
	for (k = 0; k < sizeof(st_all_dtypes) / sizeof(st_all_dtypes[0]); k++) {
		if (!strcmp(dts, st_all_dtypes[k].name)) {
			bits = st_all_dtypes[k].bits;
			st = st_all_dtypes[k].st;
			break;
		}
	}
	if (!bits)
		return eng_fail(err, -EINVAL, "%s: tensor '%s': unknown dtype '%s'",
				path, name, dts);
	if (!json_is_array(jshape))
		return eng_fail(err, -EBADMSG, "%s: tensor '%s': missing or non-array shape",
				path, name);
	ndim = json_array_size(jshape);
	if (ndim > ST_MAX_DIMS)
		return eng_fail(err, -EBADMSG, "%s: tensor '%s': %zu dimensions (at most %d)",
				path, name, ndim, ST_MAX_DIMS);
	for (i = 0; i < ndim; i++) {
		uint64_t d;

		if (json_get_u64(json_array_get(jshape, i), &d))
			return eng_fail(err, -EBADMSG,
					"%s: tensor '%s': shape[%zu] is not a non-negative integer",
					path, name, i);
		if (d && numel > UINT64_MAX / 8 / d)
			return eng_fail(err, -EBADMSG, "%s: tensor '%s': shape too large",
					path, name);
		numel *= d;
		shape[i] = (int64_t)d;
	}
	if (!json_is_array(joff) || json_array_size(joff) != 2 ||
	    json_get_u64(json_array_get(joff, 0), &begin) ||
	    json_get_u64(json_array_get(joff, 1), &end))
		return eng_fail(err, -EBADMSG,
				"%s: tensor '%s': data_offsets must be two non-negative integers",
				path, name);
	if (end < begin)
		return eng_fail(err, -EBADMSG,
				"%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
				path, name, (unsigned long long)begin, (unsigned long long)end);
	nbits = numel * bits;
	if (nbits % 8 || end - begin != nbits / 8)
		return eng_fail(err, -EBADMSG,
				"%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, "
				"%s x %llu elements need %llu",
				path, name, (unsigned long long)begin, (unsigned long long)end,
				(unsigned long long)(end - begin), dts,
				(unsigned long long)numel, (unsigned long long)(nbits / 8));
	copy = strdup(name);
	if (!copy)
		return eng_fail(err, -ENOMEM, "%s: no memory for tensor names", path);
	rg->begin = begin;
	rg->end = end;
	rg->name = copy;
	if (st < 0) {
		struct st_other *o;

		if (grow((void **)&r->others, &r->cap_others, r->nothers + 1,
			 sizeof(*r->others))) {
			free(copy);
			return eng_fail(err, -ENOMEM, "%s: no memory for tensor table", path);
		}
		o = &r->others[r->nothers++];
		o->name = copy;
		o->dtype = st_all_dtypes[k].name;
		o->file = fi;
	} else {
		struct st_tensor_info *ti;

		if (grow((void **)&r->tensors, &r->cap_tensors, r->ntensors + 1,
			 sizeof(*r->tensors))) {
			free(copy);
			return eng_fail(err, -ENOMEM, "%s: no memory for tensor table", path);
		}
		ti = &r->tensors[r->ntensors++];
		memset(ti, 0, sizeof(*ti));
		ti->name = copy;
		ti->dtype = (enum st_dtype)st;
		ti->ndim = (int)ndim;
		memcpy(ti->shape, shape, ndim * sizeof(shape[0]));
		ti->offset = data_start + begin;
		ti->nbytes = end - begin;
		ti->file = fi;
	}
	return 0;
}

/* Check that the data ranges of one file tile its data buffer exactly. */
static int check_ranges(const char *path, struct st_range *rg, size_t n,
			uint64_t data_len, struct eng_error *err)
{
	uint64_t pos = 0;
	size_t i;

	sort_table(rg, n, sizeof(*rg), cmp_range);
	for (i = 0; i < n; i++) {
		if (rg[i].end > data_len)
			return eng_fail(err, -EBADMSG,
					"%s: tensor '%s': data_offsets [%llu, %llu] beyond the end "
					"of the file (%llu data bytes)", path, rg[i].name,
					(unsigned long long)rg[i].begin,
					(unsigned long long)rg[i].end,
					(unsigned long long)data_len);
		if (rg[i].begin < pos)
			return eng_fail(err, -EBADMSG,
					"%s: tensor '%s': data_offsets [%llu, %llu] overlap the "
					"previous tensor (ending at %llu)", path, rg[i].name,
					(unsigned long long)rg[i].begin,
					(unsigned long long)rg[i].end, (unsigned long long)pos);
		if (rg[i].begin > pos)
			return eng_fail(err, -EBADMSG,
					"%s: tensor '%s': data_offsets [%llu, %llu] leave a hole "
					"after byte %llu", path, rg[i].name,
					(unsigned long long)rg[i].begin,
					(unsigned long long)rg[i].end, (unsigned long long)pos);
		pos = rg[i].end;
	}
	if (pos != data_len)
		return eng_fail(err, -EBADMSG,
				"%s: %llu data bytes but the tensors cover %llu", path,
				(unsigned long long)data_len, (unsigned long long)pos);
	return 0;
}

/* Add the tensors of r->files[fi] (open) to the reader. */
static int load_file(struct st_reader *r, int fi, struct eng_error *err)
{
	const char *path = r->files[fi].path;
	struct st_range *rg = NULL;
	unsigned char lenbuf[8];
	json_error_t jerr;
	json_t *root = NULL, *val;
	const char *key;
	struct stat sb;
	uint64_t hlen = 0, data_len;
	char *hdr = NULL;
	size_t nrg = 0, cap;
	int fd = r->files[fi].fd, rc, i;

	if (fstat(fd, &sb))
		return eng_fail(err, eng_errno_code(errno), "%s: fstat: %s", path, strerror(errno));
	if (!S_ISREG(sb.st_mode))
		return eng_fail(err, -EINVAL, "%s: not a regular file", path);
	if (sb.st_size < 8)
		return eng_fail(err, -EBADMSG, "%s: %lld bytes, too short for a safetensors file",
				path, (long long)sb.st_size);
	rc = pread_full(fd, lenbuf, 8, 0);
	if (rc)
		return eng_fail(err, rc, "%s: cannot read the header length", path);
	for (i = 7; i >= 0; i--)
		hlen = (hlen << 8) | lenbuf[i];
	if (hlen > ST_MAX_HEADER)
		return eng_fail(err, -EBADMSG, "%s: header length %llu exceeds the limit of %llu",
				path, (unsigned long long)hlen, ST_MAX_HEADER);
	if (hlen + 8 > (uint64_t)sb.st_size)
		return eng_fail(err, -EBADMSG, "%s: header length %llu past the end of the file "
				"(%lld bytes)", path, (unsigned long long)hlen,
				(long long)sb.st_size);
	hdr = malloc(hlen ? hlen : 1);
	if (!hdr)
		return eng_fail(err, -ENOMEM, "%s: no memory for a %llu-byte header", path,
				(unsigned long long)hlen);
	rc = pread_full(fd, hdr, hlen, 8);
	if (rc) {
		free(hdr);
		return eng_fail(err, rc, "%s: cannot read the header", path);
	}
	root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
	free(hdr);
	if (!root)
		return eng_fail(err, -EBADMSG, "%s: header is not valid JSON: %s (position %d)",
				path, jerr.text, jerr.position);
	if (!json_is_object(root)) {
		rc = eng_fail(err, -EBADMSG, "%s: header is not a JSON object", path);
		goto out;
	}
	cap = json_object_size(root);
	rg = calloc(cap ? cap : 1, sizeof(*rg));
	if (!rg) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory for the header", path);
		goto out;
	}
	data_len = (uint64_t)sb.st_size - 8 - hlen;
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__")) {
			const char *mk;
			json_t *mv;

			if (!json_is_object(val)) {
				rc = eng_fail(err, -EBADMSG, "%s: __metadata__ is not an object",
					      path);
				goto out;
			}
			json_object_foreach(val, mk, mv) {
				if (!json_is_string(mv)) {
					rc = eng_fail(err, -EBADMSG,
						      "%s: __metadata__.%s is not a string",
						      path, mk);
					goto out;
				}
			}
			if (fi == 0)
				r->metadata = json_incref(val);
			continue;
		}
		rc = parse_tensor(r, fi, key, val, 8 + hlen, &rg[nrg], err);
		if (rc)
			goto out;
		nrg++;
	}
	rc = check_ranges(path, rg, nrg, data_len, err);
out:
	free(rg);   /* names are owned by the tensor tables */
	json_decref(root);
	return rc;
}

/* Open `rel` beneath dirfd (io_openat: no symlink), shown as `path` in
 * messages, and add its tensors to the reader. */
static int add_file(struct st_reader *r, int dirfd, const char *rel, const char *path,
		    struct eng_error *err)
{
	struct st_file *f = realloc(r->files, (size_t)(r->nfiles + 1) * sizeof(*f));
	int fd;

	if (!f)
		return eng_fail(err, -ENOMEM, "%s: no memory", path);
	r->files = f;
	f[r->nfiles].fd = -1;
	f[r->nfiles].path = strdup(path);
	if (!f[r->nfiles].path)
		return eng_fail(err, -ENOMEM, "%s: no memory", path);
	r->nfiles++;
	fd = io_openat(dirfd, rel, O_RDONLY, 0);
	if (fd < 0)
		return eng_fail(err, eng_errno_code(-fd), "%s: cannot open: %s", path,
				eng_errno_text(-fd));
	f[r->nfiles - 1].fd = fd;
	return load_file(r, r->nfiles - 1, err);
}

static char *path_join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *p = malloc(a + b + 2);

	if (!p)
		return NULL;
	memcpy(p, dir, a);
	p[a] = '/';
	memcpy(p + a + 1, name, b + 1);
	return p;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Collect the shard file names of model.safetensors.index.json (its text
 * in `text`; sorted, unique) and open them all beneath dirfd, the
 * directory `dir`. Afterwards every weight_map entry must name a tensor of
 * the shard it points to. */
static int load_index(struct st_reader *r, int dirfd, const char *dir, const char *index,
		      const char *text, size_t text_len, struct eng_error *err)
{
	json_error_t jerr;
	json_t *root, *wm, *val;
	const char *key, **names = NULL;
	size_t n = 0, i, nuniq = 0;
	int rc = 0;

	root = json_loadb(text, text_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return eng_fail(err, -EBADMSG, "%s: invalid JSON at line %d: %s", index,
				jerr.line, jerr.text);
	wm = json_object_get(root, "weight_map");
	if (!json_is_object(wm) || json_object_size(wm) == 0) {
		rc = eng_fail(err, -EBADMSG, "%s: missing or empty weight_map object", index);
		goto out;
	}
	names = calloc(json_object_size(wm), sizeof(*names));
	if (!names) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", index);
		goto out;
	}
	json_object_foreach(wm, key, val) {
		const char *s = json_string_value(val);

		if (!s || !*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..")) {
			rc = eng_fail(err, -EBADMSG,
				      "%s: weight_map.%s must be a file name in the same directory",
				      index, key);
			goto out;
		}
		names[n++] = s;
	}
	sort_table(names, n, sizeof(*names), cmp_str);
	for (i = 0; i < n && !rc; i++) {
		char *p;

		if (i && !strcmp(names[i], names[i - 1]))
			continue;
		p = path_join(dir, names[i]);
		if (!p) {
			rc = eng_fail(err, -ENOMEM, "%s: no memory", index);
			break;
		}
		rc = add_file(r, dirfd, names[i], p, err);
		free(p);
		nuniq++;
	}
	if (rc)
		goto out;
	/* Every mapped tensor must be found in the shard the index names. */
	sort_table(r->tensors, (size_t)r->ntensors, sizeof(*r->tensors), cmp_info_name);
	sort_table(r->others, (size_t)r->nothers, sizeof(*r->others), cmp_other_name);
	json_object_foreach(wm, key, val) {
		const struct st_tensor_info *t = st_reader_find(r, key);
		const char *file = NULL, *base;

		if (t) {
			file = r->files[t->file].path;
		} else {
			struct st_other k = { .name = (char *)key }, *o;

			o = find_in_table(&k, r->others, (size_t)r->nothers, sizeof(k),
					  cmp_other_name);
			if (o)
				file = r->files[o->file].path;
		}
		base = file && strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
		if (!base || strcmp(base, json_string_value(val))) {
			rc = eng_fail(err, -EBADMSG, "%s: tensor '%s' is not in shard %s",
				      index, key, json_string_value(val));
			goto out;
		}
	}
out:
	free(names);
	json_decref(root);
	return rc;
}

#define ST_INDEX_FILE "model.safetensors.index.json"
/* An index names shards and tensors: far below this. */
#define ST_MAX_INDEX (64u << 20)

/* The directory `rel` beneath dirfd (descriptor dfd, shown as `dir`): its
 * index with all shards when present, else its model.safetensors. */
static int open_dir(struct st_reader *r, int dfd, const char *dir, struct eng_error *err)
{
	char *index = path_join(dir, ST_INDEX_FILE), *single = path_join(dir, "model.safetensors");
	char *text = NULL;
	size_t len = 0;
	int rc;

	if (!index || !single) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", dir);
		goto out;
	}
	rc = io_read_file_at(dfd, ST_INDEX_FILE, ST_MAX_INDEX, &text, &len);
	if (rc == -ENOENT)
		rc = add_file(r, dfd, "model.safetensors", single, err);
	else if (rc == -EFBIG)
		rc = eng_fail(err, -EBADMSG, "%s: larger than %u bytes", index, ST_MAX_INDEX);
	else if (rc < 0)
		rc = eng_fail(err, eng_errno_code(-rc), "%s: cannot read: %s", index,
			      eng_errno_text(-rc));
	else
		rc = load_index(r, dfd, dir, index, text, len, err);
out:
	free(text);
	free(index);
	free(single);
	return rc;
}

int st_reader_open(const char *path, struct st_reader **ret, struct eng_error *err)
{
	const char *slash = strrchr(path, '/');
	char dir[PATH_MAX];
	size_t n;
	int dfd, rc, e;

	/* A directory as named; a file inside its directory as named. */
	dfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		rc = st_reader_open_at(dfd, ".", path, ret, err);
		close(dfd);
		return rc;
	}
	e = errno;
	if (e != ENOTDIR)
		return eng_fail(err, eng_errno_code(e), "%s: %s", path, strerror(e));
	if (!slash)
		return st_reader_open_at(AT_FDCWD, path, path, ret, err);
	n = slash == path ? 1 : (size_t)(slash - path);
	if (n >= sizeof(dir))
		return eng_fail(err, -EINVAL, "%s: path too long", path);
	memcpy(dir, path, n);
	dir[n] = '\0';
	dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		e = errno;
		return eng_fail(err, eng_errno_code(e), "%s: %s", dir, strerror(e));
	}
	rc = st_reader_open_at(dfd, slash + 1, path, ret, err);
	close(dfd);
	return rc;
}

int st_reader_open_at(int dirfd, const char *rel, const char *shown, struct st_reader **ret,
		      struct eng_error *err)
{
	struct st_reader *r;
	struct stat sb;
	int rc = 0, i, fd;

	fd = io_openat(dirfd, rel, O_PATH, 0);
	if (fd < 0)
		return eng_fail(err, eng_errno_code(-fd), "%s: %s", shown, eng_errno_text(-fd));
	if (fstat(fd, &sb)) {
		rc = eng_fail(err, eng_errno_code(errno), "%s: fstat: %s", shown,
			      strerror(errno));
		close(fd);
		return rc;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		close(fd);
		return eng_fail(err, -ENOMEM, "%s: no memory", shown);
	}
	if (S_ISDIR(sb.st_mode))
		rc = open_dir(r, fd, shown, err);
	else
		rc = add_file(r, dirfd, rel, shown, err);
	close(fd);
	if (rc)
		goto out;
	sort_table(r->tensors, (size_t)r->ntensors, sizeof(*r->tensors), cmp_info_name);
	sort_table(r->others, (size_t)r->nothers, sizeof(*r->others), cmp_other_name);
	/* A name in two shards (or once as a supported and once as another
	 * dtype) is ambiguous. Within one file jansson already refused it. */
	for (i = 1; i < r->ntensors; i++) {
		if (!strcmp(r->tensors[i].name, r->tensors[i - 1].name)) {
			rc = eng_fail(err, -EBADMSG, "%s: tensor '%s' appears in %s and %s",
				      shown, r->tensors[i].name,
				      r->files[r->tensors[i - 1].file].path,
				      r->files[r->tensors[i].file].path);
			goto out;
		}
	}
	for (i = 0; i < r->nothers; i++) {
		if ((i && !strcmp(r->others[i].name, r->others[i - 1].name)) ||
		    st_reader_find(r, r->others[i].name)) {
			rc = eng_fail(err, -EBADMSG, "%s: tensor '%s' appears twice",
				      shown, r->others[i].name);
			goto out;
		}
	}
out:
	if (rc) {
		st_reader_close(r);
		return rc;
	}
	*ret = r;
	return 0;
}

int st_reader_count(const struct st_reader *r)
{
	return r->ntensors;
}

const struct st_tensor_info *st_reader_tensor(const struct st_reader *r, int i)
{
	if (i < 0 || i >= r->ntensors)
		return NULL;
	return &r->tensors[i];
}

const struct st_tensor_info *st_reader_find(const struct st_reader *r, const char *name)
{
	struct st_tensor_info key = { .name = (char *)name };

	return find_in_table(&key, r->tensors, (size_t)r->ntensors, sizeof(key), cmp_info_name);
}

const char *st_reader_metadata(const struct st_reader *r, const char *key)
{
	return json_string_value(json_object_get(r->metadata, key));
}

/* Elements [first, first + count) of tensor t converted to fp32 into
 * dst[count]. 16-bit data is read into the upper half of dst (one pread,
 * no extra memory) and widened in place from the front, a block at a time
 * through a small stack copy: block [i, i+m) writes bytes [4i, 4i+4m),
 * which ends at or before the first source byte of the next block,
 * 2*count + 2(i+m), because i + m <= count. */
static int read_elems(struct st_reader *r, const struct st_tensor_info *t, const char *name,
		      uint64_t first, uint64_t count, float *dst, struct eng_error *err)
{
	const char *path = r->files[t->file].path;
	size_t es = st_dtype_size(t->dtype);
	uint64_t off = t->offset + first * es, bytes = count * es, i;
	unsigned char *src;
	int rc;

	if (t->dtype == ST_F32) {
		rc = pread_parallel(r->files[t->file].fd, dst, bytes, off, r->threads);
		goto done;
	}
	src = (unsigned char *)dst + 2 * (size_t)count;
	rc = pread_parallel(r->files[t->file].fd, src, bytes, off, r->threads);
	if (rc)
		goto done;
	for (i = 0; i < count; i += ST_WIDEN_BLOCK) {
		uint16_t blk[ST_WIDEN_BLOCK];
		size_t m = (size_t)(count - i < ST_WIDEN_BLOCK ? count - i : ST_WIDEN_BLOCK);

		memcpy(blk, src + 2 * (size_t)i, 2 * m);
		if (t->dtype == ST_BF16)
			bf16_to_f32_n(blk, dst + i, m);
		else
			f16_to_f32_n(blk, dst + i, m);
	}
done:
	if (rc == -EBADMSG)
		return eng_fail(err, rc, "%s: tensor '%s': file ends before its data", path, name);
	if (rc)
		return eng_fail(err, rc, "%s: tensor '%s': read: %s", path, name, strerror(errno));
	return 0;
}

/* Tensor `name` and its element count, or a precise refusal. */
static int find_readable(struct st_reader *r, const char *name,
			 const struct st_tensor_info **ret, uint64_t *ret_numel,
			 struct eng_error *err)
{
	const struct st_tensor_info *t = st_reader_find(r, name);
	uint64_t have = 1;

	if (!t) {
		struct st_other key = { .name = (char *)name }, *o;

		o = find_in_table(&key, r->others, (size_t)r->nothers, sizeof(key), cmp_other_name);
		if (o)
			return eng_fail(err, -EINVAL, "%s: tensor '%s': dtype %s is not supported "
					"(F32, BF16, F16 only)", r->files[o->file].path, name,
					o->dtype);
		return eng_fail(err, -ENOENT, "tensor '%s' not found in %s", name,
				r->nfiles ? r->files[0].path : "(empty)");
	}
	for (int d = 0; d < t->ndim; d++)
		have *= (uint64_t)t->shape[d];
	*ret = t;
	*ret_numel = have;
	return 0;
}

int st_reader_read_f32(struct st_reader *r, const char *name, float *dst,
		       int64_t numel, struct eng_error *err)
{
	const struct st_tensor_info *t = NULL;
	uint64_t have = 0;
	int rc = find_readable(r, name, &t, &have, err);

	if (rc)
		return rc;
	if (numel < 0 || have != (uint64_t)numel)
		return eng_fail(err, -EINVAL, "%s: tensor '%s' has %llu elements, %lld expected",
				r->files[t->file].path, name, (unsigned long long)have,
				(long long)numel);
	return read_elems(r, t, name, 0, have, dst, err);
}

int st_reader_read_f32_range(struct st_reader *r, const char *name, int64_t first,
			     int64_t count, float *dst, struct eng_error *err)
{
	const struct st_tensor_info *t = NULL;
	uint64_t have = 0;
	int rc = find_readable(r, name, &t, &have, err);

	if (rc)
		return rc;
	if (first < 0 || count < 0 || (uint64_t)first > have || (uint64_t)count > have - (uint64_t)first)
		return eng_fail(err, -EINVAL, "%s: tensor '%s' has %llu elements, [%lld, +%lld) "
				"asked", r->files[t->file].path, name, (unsigned long long)have,
				(long long)first, (long long)count);
	return read_elems(r, t, name, (uint64_t)first, (uint64_t)count, dst, err);
}

/* --- writing ----------------------------------------------------------- */

struct st_wentry {
	char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	uint64_t numel;
	const void *data;     /* borrowed: fp32, or the stored dtype when raw */
	bool raw;             /* data already in the stored dtype (st_writer_add_raw) */
	/* st_writer_add_fill: the fp32 data made when it is written */
	int (*fill)(void *ctx, float *dst, uint64_t numel, struct eng_error *err);
	void *fill_ctx;
};

struct st_writer {
	char *path;           /* for messages */
	int dirfd;            /* the directory holding the file (a duplicate) */
	char *rel;            /* the file beneath dirfd (removed on failure) */
	int fd;
	struct st_wentry *e;
	int n, cap;
	json_t *meta;
	void (*progress)(void *ctx, uint64_t data_bytes);   /* st_writer_set_progress */
	void *progress_ctx;
};

/* Buffered output of st_writer_finish; hashes what it writes.
 *
 * Three things keep a multi-GB save at disk speed: (1) data is hashed and
 * written ST_CHUNK bytes at a time, so the hash pulls the bytes into the
 * cache and write() copies them from there (one pass over memory, not
 * two); (2) writes start at page-aligned file offsets (the header is not a
 * multiple of 4096 bytes; the page cache copies whole pages fastest);
 * (3) writeback of every completed ST_SYNC_WINDOW is started at once with
 * sync_file_range and the window before it waited for, so the disk works
 * while we convert and copy, dirty memory stays at about two windows, and
 * the final fsync has little left to do. */
struct st_out {
	int fd;
	char *buf;            /* [ST_WBUF] staging buffer */
	size_t len;           /* bytes staged in buf */
	XXH64_state_t *xs;
	uint64_t total;       /* bytes written to fd */
	uint64_t started;     /* writeback started for [0, started) */
};

static void out_pace(struct st_out *o)
{
	while (o->total - o->started >= ST_SYNC_WINDOW) {
		/* Best effort: errors surface again in the final fsync. */
		(void)sync_file_range(o->fd, (off_t)o->started, ST_SYNC_WINDOW,
				      SYNC_FILE_RANGE_WRITE);
		if (o->started >= ST_SYNC_WINDOW)
			(void)sync_file_range(o->fd, (off_t)(o->started - ST_SYNC_WINDOW),
					      ST_SYNC_WINDOW, SYNC_FILE_RANGE_WAIT_BEFORE |
					      SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
		o->started += ST_SYNC_WINDOW;
	}
}

/* Hash and write p[len] to the file. */
static int out_raw(struct st_out *o, const char *p, size_t len)
{
	int rc;

	while (len) {
		size_t n = len < ST_CHUNK ? len : ST_CHUNK;

		XXH64_update(o->xs, p, n);
		rc = io_write_full(o->fd, p, n);
		if (rc)
			return rc;
		o->total += n;
		p += n;
		len -= n;
		out_pace(o);
	}
	return 0;
}

/* Write the staged bytes up to the last page boundary of the file (all
 * of them when `all`); the rest (< 4096 bytes) moves to the front. */
static int out_flush(struct st_out *o, bool all)
{
	size_t cut = o->len;
	int rc;

	if (!all)
		cut -= (size_t)((o->total + o->len) % ST_PAGE);
	if (cut == 0 || cut > o->len)
		return 0;
	rc = out_raw(o, o->buf, cut);
	if (rc)
		return rc;
	memmove(o->buf, o->buf + cut, o->len - cut);
	o->len -= cut;
	return 0;
}

static int out_write(struct st_out *o, const void *p, size_t len)
{
	const char *src = p;
	size_t head;
	int rc;

	if (len >= ST_WBUF / 2) {
		/* Large: stage just enough to reach a page boundary of the file,
		 * then write straight from the caller's memory. */
		head = (size_t)((ST_PAGE - (o->total + o->len) % ST_PAGE) % ST_PAGE);
		if (o->len + head > ST_WBUF) {
			rc = out_flush(o, false);
			if (rc)
				return rc;
		}
		memcpy(o->buf + o->len, src, head);
		o->len += head;
		rc = out_flush(o, true);
		if (rc)
			return rc;
		return out_raw(o, src + head, len - head);
	}
	if (o->len + len > ST_WBUF) {
		rc = out_flush(o, false);
		if (rc)
			return rc;
	}
	memcpy(o->buf + o->len, src, len);
	o->len += len;
	return 0;
}

/* Convert and write one tensor stored as bf16/f16, ST_CHUNK bytes at a
 * time, so that the converted bytes are still in the cache when they are
 * hashed and written. */
static int out_write16(struct st_out *o, const struct st_wentry *e)
{
	uint64_t i = 0;
	int rc;

	while (i < e->numel) {
		uint64_t n = e->numel - i;
		size_t room;
		uint16_t *d;

		if (o->len >= ST_CHUNK) {
			rc = out_flush(o, false);   /* leaves < ST_PAGE bytes */
			if (rc)
				return rc;
		}
		room = (ST_WBUF - o->len) / 2;
		if (room > ST_CHUNK / 2)
			room = ST_CHUNK / 2;
		if (n > room)
			n = room;
		/* o->len is even here: the header block is a multiple of 8 and
		 * every tensor a multiple of 2 bytes. */
		d = (uint16_t *)(void *)(o->buf + o->len);
		if (e->dtype == ST_BF16)
			f32_to_bf16_n((const float *)e->data + i, d, n);
		else
			f32_to_f16_n((const float *)e->data + i, d, n);
		o->len += 2 * n;
		i += n;
	}
	return 0;
}

int st_writer_new(const char *path, struct st_writer **ret, struct eng_error *err)
{
	const char *slash;
	char dir[PATH_MAX];
	size_t n;
	int dfd, rc, e;

	if (!path)
		return eng_fail(err, -EINVAL, "safetensors writer: no path");
	slash = strrchr(path, '/');
	if (!slash)
		return st_writer_new_at(AT_FDCWD, path, path, ret, err);
	n = slash == path ? 1 : (size_t)(slash - path);
	if (n >= sizeof(dir))
		return eng_fail(err, -EINVAL, "%s: path too long", path);
	memcpy(dir, path, n);
	dir[n] = '\0';
	dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		e = errno;
		return eng_fail(err, eng_errno_code(e), "%s: cannot create: %s", path,
				strerror(e));
	}
	rc = st_writer_new_at(dfd, slash + 1, path, ret, err);
	close(dfd);
	return rc;
}

int st_writer_new_at(int dirfd, const char *rel, const char *shown, struct st_writer **ret,
		     struct eng_error *err)
{
	struct st_writer *w;

	if (!rel || !shown)
		return eng_fail(err, -EINVAL, "safetensors writer: no path");
	w = calloc(1, sizeof(*w));
	if (!w || !(w->path = strdup(shown)) || !(w->rel = strdup(rel)) ||
	    !(w->meta = json_object())) {
		if (w) {
			free(w->path);
			free(w->rel);
		}
		free(w);
		return eng_fail(err, -ENOMEM, "%s: no memory", shown);
	}
	w->dirfd = dirfd == AT_FDCWD ? AT_FDCWD : fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	w->fd = w->dirfd == -1 ? -errno : io_openat(w->dirfd, rel, O_WRONLY | O_CREAT | O_TRUNC,
						     0644);
	if (w->fd < 0) {
		int e = -w->fd;

		if (w->dirfd >= 0)
			close(w->dirfd);
		json_decref(w->meta);
		free(w->path);
		free(w->rel);
		free(w);
		return eng_fail(err, eng_errno_code(e), "%s: cannot create: %s", shown,
				eng_errno_text(e));
	}
	*ret = w;
	return 0;
}

/* A string that jansson accepts (valid UTF-8) and that fits in a header. */
static bool valid_utf8(const char *s)
{
	json_t *j = json_string(s);

	if (!j)
		return false;
	json_decref(j);
	return true;
}

/* st_writer_add and st_writer_add_raw: raw_bytes is the size of raw data
 * (checked against dtype x shape), or UINT64_MAX for fp32 data. */
static int writer_add(struct st_writer *w, const char *name, enum st_dtype stored,
		      int ndim, const int64_t *shape, const void *data,
		      uint64_t raw_bytes, struct eng_error *err)
{
	struct st_wentry *e;
	uint64_t numel = 1;
	int i;

	if (!name || !*name || !strcmp(name, "__metadata__") || !valid_utf8(name))
		return eng_fail(err, -EINVAL, "%s: tensor name '%s' is empty, reserved or not UTF-8",
				w->path, name ? name : "(null)");
	if (stored != ST_F32 && stored != ST_BF16 && stored != ST_F16)
		return eng_fail(err, -EINVAL, "%s: tensor '%s': unsupported dtype %d",
				w->path, name, (int)stored);
	if (ndim < 0 || ndim > ST_MAX_DIMS)
		return eng_fail(err, -EINVAL, "%s: tensor '%s': ndim %d not in [0, %d]",
				w->path, name, ndim, ST_MAX_DIMS);
	for (i = 0; i < ndim; i++) {
		if (shape[i] < 0)
			return eng_fail(err, -EINVAL, "%s: tensor '%s': shape[%d] = %lld",
					w->path, name, i, (long long)shape[i]);
		if (shape[i] && numel > (UINT64_MAX / 8) / (uint64_t)shape[i])
			return eng_fail(err, -EINVAL, "%s: tensor '%s': shape too large",
					w->path, name);
		numel *= (uint64_t)shape[i];
	}
	if (numel && !data)
		return eng_fail(err, -EINVAL, "%s: tensor '%s': no data", w->path, name);
	if (raw_bytes != UINT64_MAX && raw_bytes != numel * st_dtype_size(stored))
		return eng_fail(err, -EINVAL, "%s: tensor '%s': %llu bytes of data, %s x shape "
				"is %llu", w->path, name, (unsigned long long)raw_bytes,
				st_dtype_name(stored),
				(unsigned long long)(numel * st_dtype_size(stored)));
	for (i = 0; i < w->n; i++)
		if (!strcmp(w->e[i].name, name))
			return eng_fail(err, -EINVAL, "%s: tensor '%s' added twice", w->path, name);
	if (grow((void **)&w->e, &w->cap, w->n + 1, sizeof(*w->e)))
		return eng_fail(err, -ENOMEM, "%s: no memory", w->path);
	e = &w->e[w->n];
	memset(e, 0, sizeof(*e));
	e->name = strdup(name);
	if (!e->name)
		return eng_fail(err, -ENOMEM, "%s: no memory", w->path);
	e->dtype = stored;
	e->ndim = ndim;
	if (ndim)
		memcpy(e->shape, shape, (size_t)ndim * sizeof(*shape));
	e->numel = numel;
	e->data = data;
	e->raw = raw_bytes != UINT64_MAX;
	w->n++;
	return 0;
}

int st_writer_add(struct st_writer *w, const char *name, enum st_dtype stored,
		  int ndim, const int64_t *shape, const float *data_f32,
		  struct eng_error *err)
{
	return writer_add(w, name, stored, ndim, shape, data_f32, UINT64_MAX, err);
}

int st_writer_add_fill(struct st_writer *w, const char *name, enum st_dtype stored,
		       int ndim, const int64_t *shape,
		       int (*fill)(void *ctx, float *dst, uint64_t numel, struct eng_error *err),
		       void *ctx, struct eng_error *err)
{
	/* the data pointer only passes writer_add's check: fill makes it */
	int rc = writer_add(w, name, stored, ndim, shape, (const void *)1, UINT64_MAX, err);

	if (rc == 0) {
		w->e[w->n - 1].data = NULL;
		w->e[w->n - 1].fill = fill;
		w->e[w->n - 1].fill_ctx = ctx;
	}
	return rc;
}

int st_writer_add_raw(struct st_writer *w, const char *name, enum st_dtype stored,
		      int ndim, const int64_t *shape, const void *data, uint64_t nbytes,
		      struct eng_error *err)
{
	if (nbytes == UINT64_MAX)
		return eng_fail(err, -EINVAL, "%s: tensor '%s': bad size", w->path,
				name ? name : "(null)");
	return writer_add(w, name, stored, ndim, shape, data, nbytes, err);
}

int st_writer_meta(struct st_writer *w, const char *key, const char *value,
		   struct eng_error *err)
{
	json_t *v;

	if (!key || !value || !valid_utf8(key))
		return eng_fail(err, -EINVAL, "%s: metadata key missing or not UTF-8", w->path);
	v = json_string(value);
	if (!v)
		return eng_fail(err, -EINVAL, "%s: __metadata__.%s: value is not UTF-8",
				w->path, key);
	if (json_object_set_new(w->meta, key, v))
		return eng_fail(err, -ENOMEM, "%s: no memory", w->path);
	return 0;
}

/* Reference order: larger dtype first (F32, BF16, F16), then by name. */
static int dtype_rank(enum st_dtype dt)
{
	switch (dt) {
	case ST_F32: return 0;
	case ST_BF16: return 1;
	case ST_F16: return 2;
	}
	return 3;
}

static int cmp_wentry(const void *a, const void *b)
{
	const struct st_wentry *x = a, *y = b;

	if (x->dtype != y->dtype)
		return dtype_rank(x->dtype) - dtype_rank(y->dtype);
	return strcmp(x->name, y->name);
}

/* The header JSON (compact, unpadded) of the sorted entries; malloc'ed. */
static char *build_header(struct st_writer *w)
{
	json_t *root = json_object(), *meta = NULL;
	const char **keys = NULL;
	const char *k;
	json_t *v;
	uint64_t off = 0;
	char *text = NULL;
	size_t nk = 0, i;
	int ok = root != NULL;

	if (ok && json_object_size(w->meta)) {
		keys = calloc(json_object_size(w->meta), sizeof(*keys));
		meta = json_object();
		ok = keys && meta;
		json_object_foreach(w->meta, k, v) {
			if (ok)
				keys[nk++] = k;
		}
		if (ok)
			sort_table(keys, nk, sizeof(*keys), cmp_str);
		for (i = 0; ok && i < nk; i++)
			ok = !json_object_set(meta, keys[i], json_object_get(w->meta, keys[i]));
		ok = ok && !json_object_set(root, "__metadata__", meta);
	}
	for (i = 0; ok && i < (size_t)w->n; i++) {
		const struct st_wentry *e = &w->e[i];
		uint64_t nb = e->numel * st_dtype_size(e->dtype);
		json_t *t = json_object(), *shape = json_array(), *offs = json_array();
		int d;

		ok = t && shape && offs;
		for (d = 0; ok && d < e->ndim; d++)
			ok = !json_array_append_new(shape, json_integer(e->shape[d]));
		ok = ok && !json_array_append_new(offs, json_integer((json_int_t)off)) &&
		     !json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
		ok = ok && !json_object_set_new(t, "dtype", json_string(st_dtype_name(e->dtype)));
		ok = ok && !json_object_set(t, "shape", shape);
		ok = ok && !json_object_set(t, "data_offsets", offs);
		ok = ok && !json_object_set(root, e->name, t);
		json_decref(t);
		json_decref(shape);
		json_decref(offs);
		off += nb;
	}
	if (ok)
		text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	free(keys);
	json_decref(meta);
	json_decref(root);
	return text;
}

static void writer_free(struct st_writer *w)
{
	int i;

	for (i = 0; i < w->n; i++)
		free(w->e[i].name);
	free(w->e);
	json_decref(w->meta);
	if (w->dirfd >= 0)
		close(w->dirfd);
	free(w->rel);
	free(w->path);
	free(w);
}

int st_writer_finish(struct st_writer *w, uint64_t *ret_bytes,
		     uint64_t *ret_xxh64, struct eng_error *err)
{
	struct st_out o = { .fd = w->fd };
	unsigned char lenbuf[8];
	size_t hlen, padded;
	char *hdr = NULL;
	uint64_t xxh = 0, data_bytes = 0;
	int rc = 0, i;

	sort_table(w->e, (size_t)w->n, sizeof(*w->e), cmp_wentry);
	hdr = build_header(w);
	o.buf = malloc(ST_WBUF);
	o.xs = XXH64_createState();
	if (!hdr || !o.buf || !o.xs) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory for the header or write buffer",
			      w->path);
		goto out;
	}
	XXH64_reset(o.xs, 0);
	hlen = strlen(hdr);
	padded = (hlen + 7) & ~(size_t)7;
	for (i = 0; i < 8; i++)
		lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	rc = out_write(&o, lenbuf, 8);
	if (!rc)
		rc = out_write(&o, hdr, hlen);
	while (!rc && hlen < padded) {
		rc = out_write(&o, " ", 1);
		hlen++;
	}
	for (i = 0; !rc && i < w->n; i++) {
		struct st_wentry filled = w->e[i];
		const struct st_wentry *e = &filled;
		float *made = NULL;

		if (filled.fill) {
			/* one such tensor in memory at a time */
			made = malloc(filled.numel ? filled.numel * sizeof(float) : 1);
			rc = made ? filled.fill(filled.fill_ctx, made, filled.numel, err)
				  : eng_fail(err, -ENOMEM, "%s: tensor '%s': no memory", w->path,
					     filled.name);
			if (rc) {       /* fill's own code and message, not a write's */
				free(made);
				goto out;
			}
			filled.data = made;
		}
		if (e->dtype == ST_F32 || e->raw)
			rc = out_write(&o, e->data, e->numel * st_dtype_size(e->dtype));
		else
			rc = out_write16(&o, e);
		free(made);
		data_bytes += (uint64_t)e->numel * st_dtype_size(e->dtype);
		if (!rc && w->progress)
			w->progress(w->progress_ctx, data_bytes);
	}
	if (!rc)
		rc = out_flush(&o, true);
	if (rc) {
		rc = eng_fail(err, eng_errno_code(-rc), "%s: write: %s",
			      w->path, strerror(-rc));
		goto out;
	}
	xxh = XXH64_digest(o.xs);
	if (fsync(w->fd)) {
		rc = eng_fail(err, eng_errno_code(errno), "%s: fsync: %s", w->path,
			      strerror(errno));
		goto out;
	}
out:
	if (close(w->fd) && !rc)
		rc = eng_fail(err, eng_errno_code(errno), "%s: close: %s", w->path,
			      strerror(errno));
	if (rc)
		unlinkat(w->dirfd, w->rel, 0);
	free(hdr);
	free(o.buf);
	XXH64_freeState(o.xs);
	if (!rc) {
		if (ret_bytes)
			*ret_bytes = o.total;
		if (ret_xxh64)
			*ret_xxh64 = xxh;
	}
	writer_free(w);
	return rc;
}

void st_writer_set_progress(struct st_writer *w, void (*fn)(void *ctx, uint64_t data_bytes),
			    void *ctx)
{
	w->progress = fn;
	w->progress_ctx = ctx;
}

void st_writer_abort(struct st_writer *w)
{
	if (!w)
		return;
	close(w->fd);
	unlinkat(w->dirfd, w->rel, 0);
	writer_free(w);
}
