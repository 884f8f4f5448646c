/* test_safetensors.c — safetensors reader/writer, fp32 <-> bf16/f16
 * conversions, file_xxh64, and files never opened through a symlink
 * (engines/io/).
 *
 * References: the compiler's _Float16 conversions (libgcc / F16C, both
 * IEEE round-to-nearest-even) for f16, a naive double-precision nearest
 * search for bf16, hand-computed bytes of a reference-format file (checked
 * once against the Python `safetensors` package, see ref_file), and
 * libxxhash's one-shot XXH64 on an in-memory buffer.
 */
#include "check_run.h"
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "io/safetensors.h"

/* --- helpers ----------------------------------------------------------- */

/* The base directory is made and removed by the runner (unchecked
 * fixture), so that it goes away even when a test fails; each test works
 * in a fresh subdirectory of it. */
static char base[64];
static char tmpdir[96];
static int seq;

static void make_base(void)
{
	strcpy(base, "/tmp/test_st.XXXXXX");
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
	snprintf(tmpdir, sizeof(tmpdir), "%s/%d-%ld", base, ++seq, (long)getpid());
	ck_assert_int_eq(mkdir(tmpdir, 0700), 0);
}

static char *tpath(const char *name)
{
	static char buf[4][256];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmpdir, name);
	return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(p, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	unsigned char *p;
	long len;

	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	p = malloc((size_t)len + 1);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(fread(p, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	*n = (size_t)len;
	return p;
}

/* A file with `header` (padded with spaces to a multiple of 8 unless
 * `raw_len` is given) followed by `ndata` bytes of data. */
static void write_st(const char *path, const char *header, size_t ndata, uint64_t raw_len)
{
	size_t hl = strlen(header), pad = (hl + 7) / 8 * 8, i;
	unsigned char *buf = calloc(1, 8 + pad + ndata + 1);
	uint64_t len = raw_len ? raw_len : pad;

	ck_assert_ptr_nonnull(buf);
	for (i = 0; i < 8; i++)
		buf[i] = (unsigned char)(len >> (8 * i));
	memcpy(buf + 8, header, hl);
	memset(buf + 8 + hl, ' ', pad - hl);
	for (i = 0; i < ndata; i++)
		buf[8 + pad + i] = (unsigned char)i;
	write_bytes(path, buf, 8 + pad + ndata);
	free(buf);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static float rndf(void)
{
	return ((float)rnd32() / 4294967296.0f - 0.5f) * 8.0f;
}

static uint32_t fbits(float x)
{
	uint32_t u;

	memcpy(&u, &x, 4);
	return u;
}

static float bitsf(uint32_t u)
{
	float x;

	memcpy(&x, &u, 4);
	return x;
}

/* --- conversions ------------------------------------------------------- */

/* Naive bf16 reference: of the two bf16 neighbours (truncation and the next
 * value away from zero), the nearer in exact double arithmetic; ties to the
 * even one. Finite inputs only. */
static uint16_t ref_bf16(float x)
{
	uint32_t u = fbits(x);
	uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
	double dl = fabs((double)x - (double)bitsf((uint32_t)lo << 16));
	double dh;

	if ((hi & 0x7fff) == 0x7f80)   /* next is inf: treat as 2^128 */
		dh = fabs(fabs((double)x) - ldexp(1.0, 128));
	else
		dh = fabs((double)x - (double)bitsf((uint32_t)hi << 16));
	if (dl < dh)
		return lo;
	if (dh < dl)
		return hi;
	return (lo & 1) ? hi : lo;
}

START_TEST(bf16_conversion)
{
	static const struct { uint32_t in; uint16_t out; } cases[] = {
		{ 0x3f800000, 0x3f80 },   /* 1.0 */
		{ 0x3f808000, 0x3f80 },   /* tie, even stays */
		{ 0x3f818000, 0x3f82 },   /* tie, odd rounds up */
		{ 0x3f808001, 0x3f81 },   /* above the tie */
		{ 0x80000000, 0x8000 },   /* -0 */
		{ 0x7f800000, 0x7f80 },   /* inf */
		{ 0xff800000, 0xff80 },   /* -inf */
		{ 0x7f7fffff, 0x7f80 },   /* FLT_MAX rounds to inf */
		{ 0x00018000, 0x0002 },   /* subnormal tie, odd rounds up */
		{ 0x00008000, 0x0000 },   /* subnormal tie, even stays */
	};
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_uint_eq(f32_to_bf16(bitsf(cases[i].in)), cases[i].out);
	/* NaN stays a quiet NaN, even with the payload in the low bits only. */
	ck_assert_uint_eq(f32_to_bf16(bitsf(0x7f800001)) & 0x7fc0, 0x7fc0);
	ck_assert_uint_eq(f32_to_bf16(bitsf(0xffffffff)) & 0xffc0, 0xffc0);
	ck_assert(isnan(bf16_to_f32(f32_to_bf16(NAN))));
	ck_assert_uint_eq(fbits(bf16_to_f32(0x3fc0)), 0x3fc00000);
	for (i = 0; i < 2000000; i++) {
		uint32_t u = rnd32();
		float x = bitsf(u);

		if (isnan(x))
			continue;
		if (f32_to_bf16(x) != ref_bf16(x))
			ck_abort_msg("bf16(%08x) = %04x, reference %04x", u,
				     f32_to_bf16(x), ref_bf16(x));
	}
}
END_TEST

START_TEST(f16_conversion)
{
#ifdef __FLT16_MAX__
	uint32_t h, u;
	int d;

	/* f16 -> f32 exhaustively. */
	for (h = 0; h < 65536; h++) {
		uint16_t hb = (uint16_t)h;
		float got = f16_to_f32(hb), want;
		_Float16 hf;

		memcpy(&hf, &hb, 2);
		want = (float)hf;

		if (isnan(want))
			ck_assert_msg(isnan(got), "f16 %04x", h);
		else
			ck_assert_msg(fbits(got) == fbits(want), "f16 %04x: %08x vs %08x", h,
				      fbits(got), fbits(want));
	}
	/* f32 -> f16 at every f16 value, every midpoint between neighbours
	 * (ties) and one f32 ulp either side of it. */
	for (h = 0; h < 0x7bff; h++) {
		float a = f16_to_f32((uint16_t)h), b = f16_to_f32((uint16_t)(h + 1));
		float mid = (float)(((double)a + (double)b) / 2);   /* exact in f32 */

		for (d = -1; d <= 1; d++) {
			float xs[2] = { bitsf(fbits(mid) + (uint32_t)d), a };
			int k, s;

			for (k = 0; k < 2; k++) {
				for (s = 0; s < 2; s++) {
					float x = s ? -xs[k] : xs[k];
					_Float16 r = (_Float16)x;
					uint16_t want;

					memcpy(&want, &r, 2);
					if (f32_to_f16(x) != want)
						ck_abort_msg("f16(%08x) = %04x, want %04x",
							     fbits(x), f32_to_f16(x), want);
				}
			}
		}
	}
	/* A stride through all f32 bit patterns (overflow, underflow). */
	for (u = 7; u < 0xfffff000u; u += 4099) {
		float x = bitsf(u);
		_Float16 r = (_Float16)x;
		uint16_t want;

		memcpy(&want, &r, 2);
		if (isnan(x))
			ck_assert_uint_eq(f32_to_f16(x) & 0x7e00, 0x7e00);
		else if (f32_to_f16(x) != want)
			ck_abort_msg("f16(%08x) = %04x, want %04x", u, f32_to_f16(x), want);
	}
#endif
	/* Hand-checked values (also when the compiler lacks _Float16). */
	ck_assert_uint_eq(f32_to_f16(1.0f), 0x3c00);
	ck_assert_uint_eq(f32_to_f16(65504.0f), 0x7bff);
	ck_assert_uint_eq(f32_to_f16(65519.996f), 0x7bff);
	ck_assert_uint_eq(f32_to_f16(65520.0f), 0x7c00);       /* overflow to inf */
	ck_assert_uint_eq(f32_to_f16(-1e10f), 0xfc00);
	ck_assert_uint_eq(f32_to_f16(0x1p-24f), 0x0001);       /* smallest subnormal */
	ck_assert_uint_eq(f32_to_f16(0x1p-25f), 0x0000);       /* tie to even (0) */
	ck_assert_uint_eq(f32_to_f16(0x1.8p-24f), 0x0002);     /* tie to even (2) */
	ck_assert_uint_eq(f32_to_f16(0x1p-14f), 0x0400);       /* smallest normal */
	ck_assert_uint_eq(f32_to_f16(0x1.ff8p-15f), 0x03ff);   /* largest subnormal */
	ck_assert_uint_eq(f32_to_f16(0x1.ffcp-15f), 0x0400);   /* tie rounds up to normal */
	ck_assert_uint_eq(f32_to_f16(-0.0f), 0x8000);
	ck_assert_uint_eq(f32_to_f16(INFINITY), 0x7c00);
	ck_assert_uint_eq(f32_to_f16(NAN) & 0x7e00, 0x7e00);
	ck_assert(isnan(f16_to_f32(0x7c01)));
	ck_assert(f16_to_f32(0x0001) == 0x1p-24f);
	ck_assert(f16_to_f32(0xc000) == -2.0f);
}
END_TEST

/* The bulk (vectorized) forms agree bit for bit with the scalar ones,
 * which the tests above check against independent references. */
START_TEST(bulk_conversions)
{
	enum { N = 1 << 20 };
	float *x = malloc(N * sizeof(float)), *y = malloc(65536 * sizeof(float));
	uint16_t *h = malloc(N * sizeof(uint16_t)), *all = malloc(65536 * sizeof(uint16_t));
	size_t i;

	ck_assert(x && y && h && all);
	for (i = 0; i < N; i++) {
		uint32_t u = rnd32();

		/* a quarter of the inputs near the f16 subnormal/overflow edges */
		if (i % 4 == 1)
			u = (u & 0x807fffffu) | ((102u + u % 40u) << 23);
		x[i] = bitsf(u);
	}
	f32_to_bf16_n(x, h, N);
	for (i = 0; i < N; i++)
		if (h[i] != f32_to_bf16(x[i]))
			ck_abort_msg("bf16_n[%zu] of %08x", i, fbits(x[i]));
	f32_to_f16_n(x, h, N);
	for (i = 0; i < N; i++)
		if (h[i] != f32_to_f16(x[i]))
			ck_abort_msg("f16_n[%zu] of %08x", i, fbits(x[i]));
	for (i = 0; i < 65536; i++)
		all[i] = (uint16_t)i;
	bf16_to_f32_n(all, y, 65536);
	for (i = 0; i < 65536; i++)
		ck_assert_uint_eq(fbits(y[i]), fbits(bf16_to_f32((uint16_t)i)));
	f16_to_f32_n(all, y, 65536);
	for (i = 0; i < 65536; i++)
		ck_assert_uint_eq(fbits(y[i]), fbits(f16_to_f32((uint16_t)i)));
	free(x);
	free(y);
	free(h);
	free(all);
}
END_TEST

/* --- writer / reader --------------------------------------------------- */

START_TEST(round_trip)
{
	/* a [3, 5] F32, b [4, 3, 2] BF16, c [7] F16, big [1100000] F32 (written
	 * straight from memory), wide [4500000] BF16 (spans several
	 * conversion buffers), s [] F32 scalar, z [0, 4] F16 empty. */
	int64_t sa[2] = { 3, 5 }, sb[3] = { 4, 3, 2 }, sc[1] = { 7 }, sbig[1] = { 1100000 },
		swide[1] = { 4500000 }, sz[2] = { 0, 4 };
	float a[15], b[24], c[7], s = 3.25f, *big, *wide, *back;
	struct eng_error err = { 0 };
	struct st_writer *w;
	struct st_reader *r;
	const struct st_tensor_info *t;
	uint64_t bytes, xxh, fx;
	unsigned char *raw;
	uint64_t hlen = 0;
	size_t n, i;
	int k;

	big = malloc(sizeof(float) * 1100000);
	wide = malloc(sizeof(float) * 4500000);
	back = malloc(sizeof(float) * 4500000);
	ck_assert(big && wide && back);
	for (i = 0; i < 15; i++)
		a[i] = rndf();
	for (i = 0; i < 24; i++)
		b[i] = rndf();
	for (i = 0; i < 7; i++)
		c[i] = rndf() * 1000;
	c[6] = 70000.0f;   /* overflows f16 */
	for (i = 0; i < 1100000; i++)
		big[i] = rndf();
	for (i = 0; i < 4500000; i++)
		wide[i] = rndf();

	ck_assert_int_eq(st_writer_new(tpath("m.safetensors"), &w, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "model.b", ST_BF16, 3, sb, b, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "model.a", ST_F32, 2, sa, a, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "c", ST_F16, 1, sc, c, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "big", ST_F32, 1, sbig, big, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "wide", ST_BF16, 1, swide, wide, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "s", ST_F32, 0, NULL, &s, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "z", ST_F16, 2, sz, NULL, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "c", ST_F32, 1, sc, c, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "'c'"));
	eng_error_clear(&err);
	ck_assert_int_eq(st_writer_meta(w, "format", "pt", &err), 0);
	ck_assert_int_eq(st_writer_meta(w, "author", "engined", &err), 0);
	ck_assert_int_eq(st_writer_finish(w, &bytes, &xxh, &err), 0);

	/* Size, checksum and layout of the raw file. */
	raw = read_bytes(tpath("m.safetensors"), &n);
	ck_assert_uint_eq(bytes, n);
	ck_assert_uint_eq(xxh, XXH64(raw, n, 0));
	ck_assert_int_eq(file_xxh64(tpath("m.safetensors"), &fx, &err), 0);
	ck_assert_uint_eq(fx, xxh);
	for (k = 7; k >= 0; k--)
		hlen = (hlen << 8) | raw[k];
	ck_assert_uint_eq(hlen % 8, 0);      /* data starts 8-byte aligned */
	ck_assert_uint_eq(n, 8 + hlen + 15 * 4 + 24 * 2 + 7 * 2 + 1100000 * 4 +
			  4500000 * 2 + 4);
	{
		const char *pre = "{\"__metadata__\":{\"author\":\"engined\",\"format\":"
				  "\"pt\"},\"big\":{\"dtype\":\"F32\",\"shape\":[1100000],"
				  "\"data_offsets\":[0,4400000]},\"model.a\":";

		ck_assert_int_eq(memcmp(raw + 8, pre, strlen(pre)), 0);
	}
	ck_assert(raw[8 + hlen - 1] == '}' || raw[8 + hlen - 1] == ' ');
	/* F32 tensors lead, in name order: big, model.a, s; then BF16: model.b,
	 * wide; then F16: c, z. */
	ck_assert_int_eq(memcmp(raw + 8 + hlen, big, 4), 0);
	ck_assert_int_eq(memcmp(raw + 8 + hlen + 4400000, a, 60), 0);

	ck_assert_int_eq(st_reader_open(tpath("m.safetensors"), &r, &err), 0);
	ck_assert_int_eq(st_reader_count(r), 7);
	ck_assert_str_eq(st_reader_tensor(r, 0)->name, "big");   /* sorted by name */
	ck_assert_str_eq(st_reader_tensor(r, 6)->name, "z");
	ck_assert_ptr_null(st_reader_tensor(r, 7));
	ck_assert_str_eq(st_reader_metadata(r, "format"), "pt");
	ck_assert_str_eq(st_reader_metadata(r, "author"), "engined");
	ck_assert_ptr_null(st_reader_metadata(r, "nope"));
	t = st_reader_find(r, "model.b");
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->dtype, ST_BF16);
	ck_assert_int_eq(t->ndim, 3);
	ck_assert_int_eq(t->shape[0], 4);
	ck_assert_int_eq(t->shape[2], 2);
	ck_assert_uint_eq(t->nbytes, 48);
	ck_assert_uint_eq(t->offset, 8 + hlen + 4400000 + 60 + 4);
	ck_assert_uint_eq(t->offset % 2, 0);
	t = st_reader_find(r, "s");
	ck_assert_int_eq(t->ndim, 0);
	ck_assert_ptr_null(st_reader_find(r, "missing"));

	ck_assert_int_eq(st_reader_read_f32(r, "model.a", back, 15, &err), 0);
	ck_assert_int_eq(memcmp(back, a, sizeof(a)), 0);
	ck_assert_int_eq(st_reader_read_f32(r, "model.b", back, 24, &err), 0);
	for (i = 0; i < 24; i++)
		ck_assert_uint_eq(fbits(back[i]), fbits(bf16_to_f32(f32_to_bf16(b[i]))));
	ck_assert_int_eq(st_reader_read_f32(r, "c", back, 7, &err), 0);
	for (i = 0; i < 7; i++)
		ck_assert_uint_eq(fbits(back[i]), fbits(f16_to_f32(f32_to_f16(c[i]))));
	ck_assert(isinf(back[6]));
	ck_assert_int_eq(st_reader_read_f32(r, "big", back, 1100000, &err), 0);
	ck_assert_int_eq(memcmp(back, big, 4400000), 0);
	ck_assert_int_eq(st_reader_read_f32(r, "wide", back, 4500000, &err), 0);
	for (i = 0; i < 4500000; i++)
		if (fbits(back[i]) != fbits(bf16_to_f32(f32_to_bf16(wide[i]))))
			ck_abort_msg("wide[%zu]", i);
	ck_assert_int_eq(st_reader_read_f32(r, "s", back, 1, &err), 0);
	ck_assert(back[0] == 3.25f);
	ck_assert_int_eq(st_reader_read_f32(r, "z", back, 0, &err), 0);
	ck_assert_int_eq(st_reader_read_f32(r, "model.a", back, 14, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "model.a"));
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_read_f32(r, "nope", back, 1, &err), -ENOENT);
	st_reader_close(r);
	st_reader_close(NULL);
	free(raw);
	free(big);
	free(wide);
	free(back);
}
END_TEST

/* A file in the reference format: written by hand from the format spec and
 * identical to what `safetensors.torch.save({"weight": tensor([1., -2.]),
 * "bias": tensor([[0.5, 3.]], dtype=bfloat16)}, metadata={"format": "pt"})`
 * returns (checked with safetensors 0.8.0): F32 before BF16, compact JSON,
 * 150 header bytes padded with two spaces to 152 (0x98). */
static const char ref_header[] =
	"{\"__metadata__\":{\"format\":\"pt\"},"
	"\"weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	"\"bias\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]}}  ";
static const unsigned char ref_data[12] = {
	0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0,   /* 1.0f, -2.0f */
	0x00, 0x3f, 0x40, 0x40,                           /* bf16 0.5, 3.0 */
};

START_TEST(reference_bytes)
{
	float weight[2] = { 1.0f, -2.0f }, bias[2] = { 0.5f, 3.0f }, back[2];
	int64_t sw[1] = { 2 }, sbias[2] = { 1, 2 };
	unsigned char expect[8 + 152 + 12] = { 0x98 };
	struct eng_error err = { 0 };
	struct st_writer *w;
	struct st_reader *r;
	unsigned char *raw;
	uint64_t bytes, xxh;
	size_t n;

	ck_assert_uint_eq(strlen(ref_header), 152);
	memcpy(expect + 8, ref_header, 152);
	memcpy(expect + 160, ref_data, 12);

	ck_assert_int_eq(st_writer_new(tpath("ref.safetensors"), &w, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "weight", ST_F32, 1, sw, weight, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "bias", ST_BF16, 2, sbias, bias, &err), 0);
	ck_assert_int_eq(st_writer_meta(w, "format", "pt", &err), 0);
	ck_assert_int_eq(st_writer_finish(w, &bytes, &xxh, &err), 0);
	raw = read_bytes(tpath("ref.safetensors"), &n);
	ck_assert_uint_eq(n, sizeof(expect));
	ck_assert_int_eq(memcmp(raw, expect, n), 0);
	ck_assert_uint_eq(xxh, XXH64(expect, sizeof(expect), 0));
	free(raw);

	write_bytes(tpath("given.safetensors"), expect, sizeof(expect));
	ck_assert_int_eq(st_reader_open(tpath("given.safetensors"), &r, &err), 0);
	ck_assert_int_eq(st_reader_count(r), 2);
	ck_assert_uint_eq(st_reader_find(r, "bias")->offset, 168);
	ck_assert_int_eq(st_reader_read_f32(r, "weight", back, 2, &err), 0);
	ck_assert(back[0] == 1.0f && back[1] == -2.0f);
	ck_assert_int_eq(st_reader_read_f32(r, "bias", back, 2, &err), 0);
	ck_assert(back[0] == 0.5f && back[1] == 3.0f);
	st_reader_close(r);
}
END_TEST

/* st_writer_add_raw (enginectl's pull-weights): bytes already in the stored
 * dtype go out as they are. The same tensors as reference_bytes give the
 * same file; a signaling NaN and a payload that a conversion from fp32
 * would change (quiet bit set) keep their bits; a size that does not match
 * dtype x shape is refused. */
START_TEST(raw_writer)
{
	static const uint16_t bits[4] = { 0x7f81, 0xffff, 0x0001, 0x8000 };
	int64_t sw[1] = { 2 }, sbias[2] = { 1, 2 }, s4[1] = { 4 };
	unsigned char expect[8 + 152 + 12] = { 0x98 };
	struct eng_error err = { 0 };
	struct st_writer *w;
	struct st_reader *r;
	const struct st_tensor_info *ti;
	unsigned char *raw;
	uint64_t bytes;
	size_t n;

	memcpy(expect + 8, ref_header, 152);
	memcpy(expect + 160, ref_data, 12);
	ck_assert_int_eq(st_writer_new(tpath("raw_ref.safetensors"), &w, &err), 0);
	ck_assert_int_eq(st_writer_add_raw(w, "bias", ST_BF16, 2, sbias, ref_data + 8, 4, &err), 0);
	ck_assert_int_eq(st_writer_add_raw(w, "weight", ST_F32, 1, sw, ref_data, 8, &err), 0);
	ck_assert_int_eq(st_writer_meta(w, "format", "pt", &err), 0);
	ck_assert_int_eq(st_writer_finish(w, &bytes, NULL, &err), 0);
	ck_assert_uint_eq(bytes, sizeof(expect));
	raw = read_bytes(tpath("raw_ref.safetensors"), &n);
	ck_assert_uint_eq(n, sizeof(expect));
	ck_assert_int_eq(memcmp(raw, expect, n), 0);
	free(raw);

	ck_assert_int_eq(st_writer_new(tpath("raw_bits.safetensors"), &w, &err), 0);
	ck_assert_int_eq(st_writer_add_raw(w, "b", ST_BF16, 1, s4, bits, 8, &err), 0);
	ck_assert_int_eq(st_writer_add_raw(w, "h", ST_F16, 1, s4, bits, 8, &err), 0);
	ck_assert_int_eq(st_writer_finish(w, NULL, NULL, &err), 0);
	ck_assert_int_eq(st_reader_open(tpath("raw_bits.safetensors"), &r, &err), 0);
	raw = read_bytes(tpath("raw_bits.safetensors"), &n);
	ti = st_reader_find(r, "b");
	ck_assert_ptr_nonnull(ti);
	ck_assert_int_eq(ti->dtype, ST_BF16);
	ck_assert_uint_eq(ti->nbytes, 8);
	ck_assert_int_eq(memcmp(raw + ti->offset, bits, 8), 0);
	ti = st_reader_find(r, "h");
	ck_assert_ptr_nonnull(ti);
	ck_assert_int_eq(ti->dtype, ST_F16);
	ck_assert_int_eq(memcmp(raw + ti->offset, bits, 8), 0);
	free(raw);
	st_reader_close(r);

	ck_assert_int_eq(st_writer_new(tpath("raw_bad.safetensors"), &w, &err), 0);
	ck_assert_int_eq(st_writer_add_raw(w, "b", ST_BF16, 1, s4, bits, 6, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "6 bytes"));
	eng_error_clear(&err);
	ck_assert_int_eq(st_writer_add_raw(w, "f", ST_F32, 1, s4, bits, 8, &err), -EINVAL);
	st_writer_abort(w);
	ck_assert_int_ne(access(tpath("raw_bad.safetensors"), F_OK), 0);
}
END_TEST

/* Each corrupt header must be refused with -EBADMSG naming the file. */
START_TEST(corrupt_files)
{
	static const struct {
		const char *header;
		size_t ndata;
		uint64_t raw_len;
		const char *why;   /* expected in the message besides the path */
	} bad[] = {
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, 0, "beyond" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],", 8, 0, "JSON" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8, 0, "beyond" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, "overlap" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", 16, 0, "hole" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0, "need 12" },
		{ "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "dtype" },
		{ "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, 0, "shape" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, 0, "data_offsets" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, 0, "end" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0, "shape[0]" },
		{ "[1,2]", 0, 0, "not a JSON object" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "JSON" },
		{ "{\"__metadata__\":{\"k\":1}}", 0, 0, "__metadata__" },
		{ "{}", 4, 0, "cover" },     /* trailing bytes nobody owns */
		{ "{}", 0, 1ull << 40, "limit" },
		{ "{}", 0, 4096, "past the end" },
	};
	struct eng_error err;
	struct st_reader *r = NULL;
	char name[32];
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(name, sizeof(name), "bad%zu.safetensors", i);
		write_st(tpath(name), bad[i].header, bad[i].ndata, bad[i].raw_len);
		eng_error_clear(&err);
		ck_assert_msg(st_reader_open(tpath(name), &r, &err) == -EBADMSG,
			      "case %zu: %s", i, err.msg);
		ck_assert_msg(strstr(err.msg, name) && strstr(err.msg, bad[i].why),
			      "case %zu: message '%s'", i, err.msg);
	}
	/* Data cut short: a valid file truncated by 4 bytes. */
	write_st(tpath("trunc.safetensors"),
		 "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, 0);
	{
		struct stat sb;

		ck_assert_int_eq(stat(tpath("trunc.safetensors"), &sb), 0);
		ck_assert_int_eq(truncate(tpath("trunc.safetensors"), sb.st_size - 4), 0);
	}
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tpath("trunc.safetensors"), &r, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "trunc.safetensors"));
	/* Shorter than the length prefix. */
	write_bytes(tpath("tiny.safetensors"), "abc", 3);
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tpath("tiny.safetensors"), &r, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "tiny.safetensors"));
	/* Missing file / directory without a model. */
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tpath("none.safetensors"), &r, &err), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err.msg, "none.safetensors"));
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tmpdir, &r, &err), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err.msg, "model.safetensors"));
	ck_assert_ptr_null(r);
}
END_TEST

/* Other dtypes validate and stay readable around them; reading one is
 * -EINVAL naming it; an unknown dtype is -EINVAL at open. */
START_TEST(other_dtypes)
{
	struct eng_error err = { 0 };
	struct st_reader *r;
	float back[2];

	write_st(tpath("mixed.safetensors"),
		 "{\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
		 "\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[16,20]}}", 20, 0);
	ck_assert_int_eq(st_reader_open(tpath("mixed.safetensors"), &r, &err), 0);
	ck_assert_int_eq(st_reader_count(r), 1);
	ck_assert_ptr_null(st_reader_find(r, "ids"));
	ck_assert_int_eq(st_reader_read_f32(r, "ids", back, 2, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "'ids'"));
	ck_assert_ptr_nonnull(strstr(err.msg, "I64"));
	/* data bytes are 0..19: w = f16 0x1110, 0x1312 */
	ck_assert_int_eq(st_reader_read_f32(r, "w", back, 2, NULL), 0);
	ck_assert(back[0] == f16_to_f32(0x1110) && back[1] == f16_to_f32(0x1312));
	st_reader_close(r);

	write_st(tpath("unk.safetensors"),
		 "{\"x\":{\"dtype\":\"Q3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, 0);
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tpath("unk.safetensors"), &r, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "'x'"));
}
END_TEST

static void write_shard(const char *name, const char *t1, const char *t2, float base)
{
	int64_t shape[2] = { 2, 3 };
	float v[6];
	struct st_writer *w;
	int i;

	for (i = 0; i < 6; i++)
		v[i] = base + (float)i;
	ck_assert_int_eq(st_writer_new(tpath(name), &w, NULL), 0);
	ck_assert_int_eq(st_writer_add(w, t1, ST_BF16, 2, shape, v, NULL), 0);
	if (t2)
		ck_assert_int_eq(st_writer_add(w, t2, ST_F32, 2, shape, v, NULL), 0);
	ck_assert_int_eq(st_writer_meta(w, "format", "pt", NULL), 0);
	ck_assert_int_eq(st_writer_finish(w, NULL, NULL, NULL), 0);
}

START_TEST(sharded)
{
	static const char index[] =
		"{\"metadata\": {\"total_size\": 56}, \"weight_map\": {"
		"\"model.embed.weight\": \"model-00001-of-00002.safetensors\","
		"\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
		"\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}";
	struct eng_error err = { 0 };
	const struct st_tensor_info *a, *b;
	struct st_reader *r;
	float back[6];
	const char *text;
	int i;

	write_shard("model-00001-of-00002.safetensors", "model.embed.weight",
		    "model.norm.weight", 1.0f);
	write_shard("model-00002-of-00002.safetensors", "lm_head.weight", NULL, 10.0f);
	write_bytes(tpath("model.safetensors.index.json"), index, strlen(index));
	ck_assert_int_eq(st_reader_open(tmpdir, &r, &err), 0);
	ck_assert_int_eq(st_reader_count(r), 3);
	a = st_reader_find(r, "model.embed.weight");
	b = st_reader_find(r, "lm_head.weight");
	ck_assert(a && b && a->file != b->file);
	ck_assert_int_eq(st_reader_find(r, "model.norm.weight")->file, a->file);
	ck_assert_str_eq(st_reader_metadata(r, "format"), "pt");
	ck_assert_int_eq(st_reader_read_f32(r, "lm_head.weight", back, 6, &err), 0);
	for (i = 0; i < 6; i++)
		ck_assert(back[i] == 10.0f + (float)i);   /* exact in bf16 */
	ck_assert_int_eq(st_reader_read_f32(r, "model.norm.weight", back, 6, &err), 0);
	for (i = 0; i < 6; i++)
		ck_assert(back[i] == 1.0f + (float)i);
	st_reader_close(r);

	/* The index names a shard that lacks the tensor. */
	text = "{\"weight_map\": {"
		"\"model.embed.weight\": \"model-00001-of-00002.safetensors\","
		"\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
		"\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}}";
	write_bytes(tpath("model.safetensors.index.json"), text, strlen(text));
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tmpdir, &r, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "lm_head.weight"));
	/* A missing shard. */
	write_bytes(tpath("model.safetensors.index.json"), index, strlen(index));
	ck_assert_int_eq(unlink(tpath("model-00002-of-00002.safetensors")), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tmpdir, &r, &err), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err.msg, "model-00002-of-00002.safetensors"));
	/* A broken index. */
	write_bytes(tpath("model.safetensors.index.json"), "{\"weight_map\": 3}", 17);
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tmpdir, &r, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "model.safetensors.index.json"));
}
END_TEST

START_TEST(xxh64_of_files)
{
	size_t n = (9u << 20) + 12345, i;   /* more than one 8 MiB read */
	unsigned char *buf = malloc(16u << 20);
	struct eng_error err = { 0 };
	uint64_t h;

	ck_assert_ptr_nonnull(buf);
	for (i = 0; i < (16u << 20); i++)
		buf[i] = (unsigned char)rnd32();
	write_bytes(tpath("blob"), buf, n);
	ck_assert_int_eq(file_xxh64(tpath("blob"), &h, &err), 0);
	ck_assert_uint_eq(h, XXH64(buf, n, 0));
	/* Exactly two reads: the reader thread's end of file after a full
	 * buffer. */
	write_bytes(tpath("blob2"), buf, 16u << 20);
	ck_assert_int_eq(file_xxh64(tpath("blob2"), &h, &err), 0);
	ck_assert_uint_eq(h, XXH64(buf, 16u << 20, 0));
	write_bytes(tpath("empty"), buf, 0);
	ck_assert_int_eq(file_xxh64(tpath("empty"), &h, &err), 0);
	ck_assert_uint_eq(h, 0xef46db3751d8e999ull);   /* XXH64 of no bytes, seed 0 */
	ck_assert_int_eq(file_xxh64(tpath("nothing"), &h, &err), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err.msg, "nothing"));
	free(buf);
}
END_TEST

/* Tensors of 1 MiB and more are read by several threads
 * (st_reader_set_threads): the same values whatever the thread count,
 * for f32 (read in place) and bf16 / f16 (read into the upper half, then
 * widened); a file cut short is still an error. */
START_TEST(parallel_reads)
{
	const int64_t n = (3 << 20) / 2 + 3;   /* 6 MiB of f32, 3 MiB of 16-bit */
	float *src = malloc((size_t)n * sizeof(float));
	float *got = malloc((size_t)n * sizeof(float));
	struct eng_error err = { 0 };
	struct st_writer *w;
	struct st_reader *r;
	const char *names[] = { "f32", "bf16", "f16" };
	const int threads[] = { 1, 2, 3, 100 };

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(got);
	for (int64_t i = 0; i < n; i++)   /* exact in bf16 and f16 */
		src[i] = (float)((int)(rnd32() % 512) - 256) / 64.0f;
	ck_assert_int_eq(st_writer_new(tpath("par.safetensors"), &w, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "f32", ST_F32, 1, &n, src, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "bf16", ST_BF16, 1, &n, src, &err), 0);
	ck_assert_int_eq(st_writer_add(w, "f16", ST_F16, 1, &n, src, &err), 0);
	ck_assert_int_eq(st_writer_finish(w, NULL, NULL, &err), 0);
	ck_assert_int_eq(st_reader_open(tpath("par.safetensors"), &r, &err), 0);
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		st_reader_set_threads(r, threads[t]);
		for (int k = 0; k < 3; k++) {
			memset(got, 0xff, (size_t)n * sizeof(float));
			ck_assert_int_eq(st_reader_read_f32(r, names[k], got, n, &err), 0);
			if (memcmp(got, src, (size_t)n * sizeof(float))) {
				int64_t i = 0;

				while (got[i] == src[i])
					i++;
				ck_abort_msg("%s, %d threads: [%lld] %g, not %g", names[k],
					     threads[t], (long long)i, got[i], src[i]);
			}
		}
	}
	st_reader_close(r);
	/* Cut the file inside the f32 tensor's second half: every thread
	 * count reports the short file. */
	ck_assert_int_eq(st_reader_open(tpath("par.safetensors"), &r, &err), 0);
	ck_assert_int_eq(truncate(tpath("par.safetensors"),
				  st_reader_find(r, "f32")->offset + (n * 4) * 3 / 4), 0);
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		st_reader_set_threads(r, threads[t]);
		eng_error_clear(&err);
		ck_assert_int_lt(st_reader_read_f32(r, "f32", got, n, &err), 0);
	}
	st_reader_close(r);
	free(src);
	free(got);
}
END_TEST

START_TEST(writer_abort_and_errors)
{
	struct eng_error err = { 0 };
	struct st_writer *w;
	int64_t shape[1] = { -1 };
	float x = 1.0f;

	ck_assert_int_eq(st_writer_new(tpath("gone.safetensors"), &w, &err), 0);
	ck_assert_int_eq(access(tpath("gone.safetensors"), F_OK), 0);
	ck_assert_int_eq(st_writer_add(w, "x", ST_F32, 1, shape, &x, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "shape[0]"));
	eng_error_clear(&err);
	ck_assert_int_eq(st_writer_add(w, "__metadata__", ST_F32, 0, NULL, &x, &err), -EINVAL);
	st_writer_abort(w);
	st_writer_abort(NULL);
	ck_assert_int_ne(access(tpath("gone.safetensors"), F_OK), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(st_writer_new(tpath("no/such/dir.safetensors"), &w, &err), -ENOENT);
	/* An empty file is valid: "{}" padded to 8 bytes. */
	ck_assert_int_eq(st_writer_new(tpath("empty.safetensors"), &w, &err), 0);
	ck_assert_int_eq(st_writer_finish(w, NULL, NULL, &err), 0);
	{
		size_t n;
		unsigned char *raw = read_bytes(tpath("empty.safetensors"), &n);
		struct st_reader *r;

		ck_assert_uint_eq(n, 16);
		ck_assert_int_eq(memcmp(raw, "\x08\0\0\0\0\0\0\0{}      ", 16), 0);
		free(raw);
		ck_assert_int_eq(st_reader_open(tpath("empty.safetensors"), &r, &err), 0);
		ck_assert_int_eq(st_reader_count(r), 0);
		st_reader_close(r);
	}
	ck_assert_uint_eq(st_dtype_size(ST_BF16), 2);
	ck_assert_str_eq(st_dtype_name(ST_F16), "F16");
}
END_TEST

/* Files are never opened through a symlink: a symlinked file, a
 * directory's model.safetensors, index or shard; the writer does not write
 * through one. A directory named by the caller may be a symlink. */
START_TEST(symlinks_refused)
{
	static const char index[] =
		"{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}";
	struct eng_error err = { 0 };
	struct st_reader *r = NULL;
	struct st_writer *w = NULL;
	char cmd[1024];
	uint64_t h;
	size_t n;
	unsigned char *raw;
	int dfd;

	/* out/: a valid model directory outside; in/: links into it. */
	ck_assert_int_eq(mkdir(tpath("out"), 0755), 0);
	ck_assert_int_eq(mkdir(tpath("in"), 0755), 0);
	write_shard("out/model.safetensors", "a", "b", 1.0f);
	write_shard("out/s1.safetensors", "a", NULL, 1.0f);
	write_shard("out/s2.safetensors", "b", NULL, 2.0f);
	write_bytes(tpath("out/model.safetensors.index.json"), index, strlen(index));
	ck_assert_int_eq(st_reader_open(tpath("out"), &r, &err), 0);   /* valid as such */
	st_reader_close(r);

	ck_assert_int_eq(symlink("../out/model.safetensors", tpath("in/model.safetensors")), 0);
	ck_assert_int_eq(st_reader_open(tpath("in/model.safetensors"), &r, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "in/model.safetensors"));
	ck_assert_ptr_nonnull(strstr(err.msg, "symlink"));
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tpath("in"), &r, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "in/model.safetensors"));
	ck_assert_int_eq(unlink(tpath("in/model.safetensors")), 0);
	/* The index as a symlink, then a shard as one. */
	ck_assert_int_eq(symlink("../out/model.safetensors.index.json",
				 tpath("in/model.safetensors.index.json")), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tpath("in"), &r, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "in/model.safetensors.index.json"));
	ck_assert_int_eq(unlink(tpath("in/model.safetensors.index.json")), 0);
	write_bytes(tpath("in/model.safetensors.index.json"), index, strlen(index));
	write_shard("in/s1.safetensors", "a", NULL, 1.0f);
	ck_assert_int_eq(symlink("../out/s2.safetensors", tpath("in/s2.safetensors")), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open(tpath("in"), &r, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "in/s2.safetensors"));
	ck_assert_int_eq(unlink(tpath("in/s2.safetensors")), 0);
	write_shard("in/s2.safetensors", "b", NULL, 2.0f);
	ck_assert_int_eq(st_reader_open(tpath("in"), &r, &err), 0);
	st_reader_close(r);
	/* The directory itself through a symlink, as named: fine. */
	ck_assert_int_eq(symlink("in", tpath("alias")), 0);
	ck_assert_int_eq(st_reader_open(tpath("alias"), &r, &err), 0);
	st_reader_close(r);
	/* ... but not below a descriptor: no symlink in rel. */
	dfd = open(tmpdir, O_PATH | O_DIRECTORY);
	ck_assert_int_ge(dfd, 0);
	eng_error_clear(&err);
	ck_assert_int_eq(st_reader_open_at(dfd, "alias", "shown/alias", &r, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "shown/alias"));
	ck_assert_int_eq(st_reader_open_at(dfd, "in", "shown/in", &r, &err), 0);
	st_reader_close(r);

	/* The writer refuses to write through a symlink, and its abort does
	 * not remove the target. */
	raw = read_bytes(tpath("out/model.safetensors"), &n);
	ck_assert_int_eq(symlink("../out/model.safetensors", tpath("in/w.safetensors")), 0);
	eng_error_clear(&err);
	ck_assert_int_eq(st_writer_new(tpath("in/w.safetensors"), &w, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "in/w.safetensors"));
	eng_error_clear(&err);
	ck_assert_int_eq(st_writer_new_at(dfd, "alias/x.safetensors", "shown/x", &w, &err),
			 -EPERM);
	ck_assert_int_ne(access(tpath("in/x.safetensors"), F_OK), 0);
	ck_assert_int_eq(file_xxh64(tpath("in/w.safetensors"), &h, &err), -EPERM);
	{
		size_t n2;
		unsigned char *raw2 = read_bytes(tpath("out/model.safetensors"), &n2);

		ck_assert_uint_eq(n2, n);
		ck_assert_int_eq(memcmp(raw, raw2, n), 0);
		free(raw2);
	}
	free(raw);
	/* A writer beneath a descriptor creates and removes only its file. */
	ck_assert_int_eq(st_writer_new_at(dfd, "in/y.safetensors", "shown/y", &w, &err), 0);
	ck_assert_int_eq(access(tpath("in/y.safetensors"), F_OK), 0);
	st_writer_abort(w);
	ck_assert_int_ne(access(tpath("in/y.safetensors"), F_OK), 0);
	close(dfd);
	snprintf(cmd, sizeof(cmd), "test -f '%s' && test -f '%s'", tpath("out/s2.safetensors"),
		 tpath("out/model.safetensors.index.json"));
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc = tcase_create("core");

	tcase_add_unchecked_fixture(tc, make_base, remove_base);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, bf16_conversion);
	tcase_add_test(tc, f16_conversion);
	tcase_add_test(tc, bulk_conversions);
	tcase_add_test(tc, round_trip);
	tcase_add_test(tc, reference_bytes);
	tcase_add_test(tc, raw_writer);
	tcase_add_test(tc, corrupt_files);
	tcase_add_test(tc, other_dtypes);
	tcase_add_test(tc, sharded);
	tcase_add_test(tc, xxh64_of_files);
	tcase_add_test(tc, parallel_reads);
	tcase_add_test(tc, writer_abort_and_errors);
	tcase_add_test(tc, symlinks_refused);
	suite_add_tcase(s, tc);
	return check_run(s);
}
