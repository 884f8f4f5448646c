/* test_cpu_optim.c — CPU AdamW, sum of squares, finiteness check and the
 * bf16 / IEEE half converters (and that they round exactly as engines/io's
 * safetensors conversions do). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "io/safetensors.h"
#include "cpu_test_util.h"

/* Two AdamW steps (lr 0.1, betas 0.9/0.99, eps 1e-8, weight decay 0.01,
 * grad_scale 0.5) against torch 1.13 torch.optim.AdamW(foreach=False) with
 * p.grad = 0.5 * g, printed with %.9g. Element 0 of step 1 by hand:
 * g = 0.05, p = 0.5 (1 - 0.001) = 0.4995, m = 0.1 g = 0.005,
 * v = 0.01 g^2 = 2.5e-5, bc1 = 0.1, bc2 = 0.01,
 * denom = sqrt(2.5e-5) / 0.1 + 1e-8 = 0.05 (+1e-8),
 * p = 0.4995 - (0.1 / 0.1) (0.005 / 0.05) = 0.3995.
 * Element 2 has g = 0 at step 1: m = v = 0, the update is 0 / eps = 0.
 * Tolerance: 2e-7 relative + 1e-12 (the kernel may fuse multiply-adds
 * where torch does not). */
START_TEST(adamw_two_steps)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	static const float p0[5] = { 0.5f, -1.25f, 2.0f, 0.0f, 3.0e-3f };
	static const float g1[5] = { 0.1f, -0.2f, 0.0f, 1.5f, -3.0e-4f };
	static const float g2[5] = { -0.3f, 0.05f, 0.25f, 1.0f, 2.0e-4f };
	static const double want_p[2][5] = {
		{ 0.399500012, -1.14874995, 1.99800003, -0.100000009, 0.102990337 },
		{ 0.44843033, -1.10056043, 1.92175615, -0.197019786, 0.117350861 },
	};
	static const double want_m[2][5] = {
		{ 0.00500000035, -0.0100000007, 0, 0.075000003, -1.50000005e-05 },
		{ -0.0105000008, -0.0065000006, 0.0125000002, 0.117500007, -3.50000005e-06 },
	};
	static const double want_v[2][5] = {
		{ 2.50000012e-05, 0.000100000005, 0, 0.00562499976, 2.25000019e-10 },
		{ 0.00024975001, 0.000105250008, 0.000156249997, 0.00806874968, 3.22750021e-10 },
	};
	float *p = tu_falloc(dev, 5), *g = tu_falloc(dev, 5);
	float *m = tu_falloc(dev, 5), *v = tu_falloc(dev, 5);
	int step;

	memcpy(p, p0, sizeof(p0));
	memset(m, 0, 5 * sizeof(float));
	memset(v, 0, 5 * sizeof(float));
	for (step = 1; step <= 2; step++) {
		memcpy(g, step == 1 ? g1 : g2, sizeof(g1));
		ck_assert_int_eq(dev->k->adamw(dev, p, g, m, v, 5, 0.1, 0.9, 0.99, 1e-8,
					       0.01, step, 0.5f), 0);
		ck_assert_msg(tu_err_f(p, want_p[step - 1], 5, 1e-12, 2e-7) <= 1.0, "p step %d", step);
		ck_assert_msg(tu_err_f(m, want_m[step - 1], 5, 1e-12, 2e-7) <= 1.0, "m step %d", step);
		ck_assert_msg(tu_err_f(v, want_v[step - 1], 5, 1e-12, 2e-7) <= 1.0, "v step %d", step);
		/* the step consumes the gradients (zero_grad fused) */
		for (int i = 0; i < 5; i++)
			ck_assert_msg(g[i] == 0.0f && !signbit(g[i]), "g[%d] = %g", i, g[i]);
	}
	ck_assert_int_eq(dev->k->adamw(dev, p, g, m, v, 5, 0.1, 0.9, 0.99, 1e-8,
				       0.01, 0, 1.0f), -EINVAL);
	dev->ops->free(dev, p);
	dev->ops->free(dev, g);
	dev->ops->free(dev, m);
	dev->ops->free(dev, v);
	tu_close(dev);
}
END_TEST

/* An element's update does not depend on where it lies: the vectorized
 * body and the loop's remainder (and the chunks a ZeRO-1 shard starts
 * inside) give the same bits, so N ranks updating their slices equal one
 * engine updating everything. Slices at odd offsets against one call over
 * all 3 x 8192 + 37 elements, two steps. */
START_TEST(adamw_same_bits_wherever_an_element_lies)
{
	enum { NE = 3 * 8192 + 37 };
	static const int64_t cut[] = { 0, 1, 6, 8191, 8200, 16411, 16417, NE };
	struct device *dev = tu_open(2, MATMUL_FP32);
	float *p[2], *g[2], *m[2], *v[2];
	float *g0 = malloc(NE * sizeof(float));

	ck_assert_ptr_nonnull(g0);
	for (int k = 0; k < 2; k++) {
		p[k] = tu_falloc(dev, NE);
		g[k] = tu_falloc(dev, NE);
		m[k] = tu_falloc(dev, NE);
		v[k] = tu_falloc(dev, NE);
	}
	tu_seed(31);
	tu_fill(p[0], NE, -2.0f, 2.0f);
	memcpy(p[1], p[0], NE * sizeof(float));
	for (int k = 0; k < 2; k++) {
		memset(m[k], 0, NE * sizeof(float));
		memset(v[k], 0, NE * sizeof(float));
	}
	for (int step = 1; step <= 2; step++) {
		tu_fill(g0, NE, -1e-2f, 1e-2f);
		memcpy(g[0], g0, NE * sizeof(float));
		memcpy(g[1], g0, NE * sizeof(float));
		ck_assert_int_eq(dev->k->adamw(dev, p[0], g[0], m[0], v[0], NE, 1e-3, 0.9, 0.999,
					       1e-8, 0.01, step, 0.7f), 0);
		for (size_t c = 0; c + 1 < sizeof(cut) / sizeof(cut[0]); c++) {
			int64_t lo = cut[c], len = cut[c + 1] - cut[c];

			ck_assert_int_eq(dev->k->adamw(dev, p[1] + lo, g[1] + lo, m[1] + lo,
						       v[1] + lo, len, 1e-3, 0.9, 0.999, 1e-8,
						       0.01, step, 0.7f), 0);
		}
		ck_assert_mem_eq(p[0], p[1], NE * sizeof(float));
		ck_assert_mem_eq(m[0], m[1], NE * sizeof(float));
		ck_assert_mem_eq(v[0], v[1], NE * sizeof(float));
	}
	for (int k = 0; k < 2; k++) {
		dev->ops->free(dev, p[k]);
		dev->ops->free(dev, g[k]);
		dev->ops->free(dev, m[k]);
		dev->ops->free(dev, v[k]);
	}
	free(g0);
	tu_close(dev);
}
END_TEST

/* sumsq: within 1e-12 relative of a long-double sum, over sizes around the
 * kernel's block size; the same data gives the same bits with 1 and 2
 * threads and run after run; inf and NaN propagate. all_finite: finite
 * extremes (FLT_MAX, subnormals, -0) are finite; one inf or NaN anywhere is
 * not. */
START_TEST(sumsq_all_finite)
{
	struct device *dev = tu_open(2, MATMUL_FP32), *dev1 = tu_open(1, MATMUL_FP32);
	static const int64_t sizes[] = { 0, 1, 17, 16384, 16385, 100003 };
	const int64_t nmax = 100003;
	float *x = tu_falloc(dev, nmax);
	double s, s2, s1;
	bool fin;
	size_t k;

	tu_seed(30);
	tu_fill(x, nmax, -3.0f, 3.0f);
	for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		long double ref = 0.0L;
		int64_t i;

		for (i = 0; i < sizes[k]; i++)
			ref += (long double)x[i] * x[i];
		ck_assert_int_eq(dev->k->sumsq(dev, &s, x, sizes[k]), 0);
		ck_assert_msg(fabs(s - (double)ref) <= 1e-12 * (double)ref,
			      "n=%ld: %.17g vs %.17Lg", (long)sizes[k], s, ref);
		ck_assert_int_eq(dev->k->sumsq(dev, &s2, x, sizes[k]), 0);
		ck_assert_int_eq(dev1->k->sumsq(dev1, &s1, x, sizes[k]), 0);
		ck_assert_mem_eq(&s, &s2, sizeof(s));
		ck_assert_mem_eq(&s, &s1, sizeof(s));
	}

	x[0] = 3.4028235e38f;     /* FLT_MAX: its square is finite in double */
	x[1] = 1e-45f;            /* subnormal */
	x[2] = -0.0f;
	ck_assert_int_eq(dev->k->all_finite(dev, &fin, x, nmax), 0);
	ck_assert(fin);
	ck_assert_int_eq(dev->k->sumsq(dev, &s, x, nmax), 0);
	ck_assert(isfinite(s) && s > 1e76);
	x[nmax - 1] = INFINITY;
	ck_assert_int_eq(dev->k->all_finite(dev, &fin, x, nmax), 0);
	ck_assert(!fin);
	ck_assert_int_eq(dev->k->sumsq(dev, &s, x, nmax), 0);
	ck_assert(isinf(s));
	x[nmax - 1] = 1.0f;
	x[50000] = NAN;
	ck_assert_int_eq(dev->k->all_finite(dev, &fin, x, nmax), 0);
	ck_assert(!fin);
	ck_assert_int_eq(dev->k->sumsq(dev, &s, x, nmax), 0);
	ck_assert(isnan(s));
	x[50000] = -INFINITY;
	ck_assert_int_eq(dev->k->all_finite(dev, &fin, x + 49999, 2), 0);
	ck_assert(!fin);
	ck_assert_int_eq(dev->k->all_finite(dev, &fin, x, 0), 0);
	ck_assert(fin);
	dev->ops->free(dev, x);
	tu_close(dev);
	tu_close(dev1);
}
END_TEST

static float from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t to_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/* Independent bf16 reference for finite x: the nearer of the truncation
 * and the next bf16 up in magnitude, by exact distance in double; ties to
 * the even one (inf when rounding past the largest bf16). */
static uint16_t ref_bf16_bits(float x)
{
	uint32_t u = to_bits(x), lo = u & 0xffff0000u, hi = lo + 0x10000u;
	double dl = fabs((double)x - from_bits(lo));
	double dh = fabs((double)from_bits(hi) - x);

	if ((hi & 0x7fffffffu) >= 0x7f800000u)         /* next up is inf */
		dh = fabs(0x1.0p128 * (x < 0 ? -1 : 1) - (double)x);
	if (dl < dh || (dl == dh && !((lo >> 16) & 1)))
		return (uint16_t)(lo >> 16);
	return (uint16_t)(hi >> 16);
}

struct conv_case {
	uint32_t in;
	uint16_t out;
};

/* bf16: hand-made bit patterns at each rounding situation, then 200000
 * random bit patterns against the independent reference above. */
START_TEST(convert_bf16)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	static const struct conv_case cases[] = {
		{ 0x3f800000u, 0x3f80 },   /* 1.0 */
		{ 0x3f808000u, 0x3f80 },   /* 1 + 2^-8: tie, 0x3f80 is even */
		{ 0x3f818000u, 0x3f82 },   /* tie, 0x3f81 odd: up */
		{ 0x3f808001u, 0x3f81 },   /* above the tie */
		{ 0x3f807fffu, 0x3f80 },   /* below the tie */
		{ 0xbf818000u, 0xbf82 },   /* negative tie */
		{ 0x80000000u, 0x8000 },   /* -0 */
		{ 0x7f800000u, 0x7f80 },   /* inf */
		{ 0xff800000u, 0xff80 },   /* -inf */
		{ 0x7f7fffffu, 0x7f80 },   /* FLT_MAX rounds past 0x7f7f: inf */
		{ 0x7f7f7fffu, 0x7f7f },   /* largest that stays finite */
		{ 0x00010000u, 0x0001 },   /* subnormal, exact */
		{ 0x00018000u, 0x0002 },   /* subnormal tie, odd: up */
		{ 0x00008000u, 0x0000 },   /* tie with 0: even */
		{ 0x00008001u, 0x0001 },
		{ 0x7fc00000u, 0x7fc0 },   /* quiet NaN */
		{ 0xffc00001u, 0xffc0 },   /* negative NaN keeps its sign */
	};
	const int64_t n = 200000;
	float *x = tu_falloc(dev, n);
	uint16_t *out = dev->ops->alloc(dev, n * sizeof(uint16_t));
	size_t k;
	int64_t i;

	ck_assert_ptr_nonnull(out);
	for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
		x[k] = from_bits(cases[k].in);
	ck_assert_int_eq(dev->k->to_bf16(dev, out, x, (int64_t)k), 0);
	for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
		ck_assert_msg(out[k] == cases[k].out, "bf16(0x%08x) = 0x%04x, want 0x%04x",
			      cases[k].in, out[k], cases[k].out);
	/* signalling NaN (the truncation alone would give inf) stays NaN */
	x[0] = from_bits(0x7f800001u);
	ck_assert_int_eq(dev->k->to_bf16(dev, out, x, 1), 0);
	ck_assert((out[0] & 0x7f80) == 0x7f80 && (out[0] & 0x7f) != 0);

	tu_seed(31);
	for (i = 0; i < n; i++) {
		uint32_t u = (uint32_t)tu_u64();

		if ((u & 0x7f800000u) == 0x7f800000u)
			u &= 0xbfffffffu;              /* keep it finite */
		x[i] = from_bits(u);
	}
	ck_assert_int_eq(dev->k->to_bf16(dev, out, x, n), 0);
	for (i = 0; i < n; i++)
		ck_assert_msg(out[i] == ref_bf16_bits(x[i]), "bf16(0x%08x) = 0x%04x want 0x%04x",
			      to_bits(x[i]), out[i], ref_bf16_bits(x[i]));
	dev->ops->free(dev, x);
	dev->ops->free(dev, out);
	tu_close(dev);
}
END_TEST

/* f16: hand-made cases in the normal, overflow and subnormal ranges, then
 * 200000 random floats against the compiler's IEEE conversion to _Float16
 * (round to nearest even, done by GCC / the CPU, independent code). */
START_TEST(convert_f16)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	static const struct {
		float in;
		uint16_t out;
	} cases[] = {
		{ 1.0f, 0x3c00 },
		{ -2.0f, 0xc000 },
		{ 0.1f, 0x2e66 },
		{ 65504.0f, 0x7bff },          /* largest half */
		{ 65519.0f, 0x7bff },          /* below the overflow tie */
		{ 65520.0f, 0x7c00 },          /* tie past the largest: inf */
		{ 1e10f, 0x7c00 },
		{ -1e10f, 0xfc00 },
		{ 0x1.002p0f, 0x3c00 },        /* 1 + 2^-11: tie, even */
		{ 0x1.006p0f, 0x3c02 },        /* 1 + 3 2^-11: tie, odd: up */
		{ 0x1.0p-14f, 0x0400 },        /* smallest normal */
		{ 0x1.ffcp-15f, 0x0400 },      /* 2^-14 - 2^-25: tie into the normal */
		{ 0x1.0p-24f, 0x0001 },        /* smallest subnormal */
		{ 0x1.0p-25f, 0x0000 },        /* tie with 0: even */
		{ 0x1.000002p-25f, 0x0001 },   /* just above the tie */
		{ 0x1.8p-24f, 0x0002 },        /* 1.5 ulp: tie, odd: up */
		{ 0x1.4p-23f, 0x0002 },        /* 2.5 ulp: tie, even: down */
		{ -0x1.0p-24f, 0x8001 },
		{ 1e-45f, 0x0000 },            /* float subnormal */
		{ -0.0f, 0x8000 },
	};
	const int64_t n = 200000;
	float *x = tu_falloc(dev, n);
	uint16_t *out = dev->ops->alloc(dev, n * sizeof(uint16_t));
	size_t k;

	ck_assert_ptr_nonnull(out);
	for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
		x[k] = cases[k].in;
	x[k++] = INFINITY;
	x[k++] = NAN;
	x[k++] = from_bits(0xff800001u);              /* negative signalling NaN */
	ck_assert_int_eq(dev->k->to_f16(dev, out, x, (int64_t)k), 0);
	for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
		ck_assert_msg(out[k] == cases[k].out, "f16(%a) = 0x%04x, want 0x%04x",
			      (double)cases[k].in, out[k], cases[k].out);
	ck_assert_uint_eq(out[k], 0x7c00);
	ck_assert((out[k + 1] & 0x7c00) == 0x7c00 && (out[k + 1] & 0x3ff) != 0);
	ck_assert((out[k + 2] & 0xfc00) == 0xfc00 && (out[k + 2] & 0x3ff) != 0);

#ifdef __FLT16_MAX__  /* the compiler has _Float16 (GCC; clang 14 on x86 does not) */
	tu_seed(32);
	for (int64_t i = 0; i < n; i++) {
		/* exponents around the half range: 2^-30 .. 2^20 */
		int e = (int)(tu_u64() % 51) - 30;

		x[i] = ldexpf(tu_uniform(-2.0f, 2.0f), e);
	}
	ck_assert_int_eq(dev->k->to_f16(dev, out, x, n), 0);
	for (int64_t i = 0; i < n; i++) {
		_Float16 h = (_Float16)x[i];
		uint16_t want;

		memcpy(&want, &h, sizeof(want));
		ck_assert_msg(out[i] == want, "f16(%a) = 0x%04x want 0x%04x",
			      (double)x[i], out[i], want);
	}
#endif
	dev->ops->free(dev, x);
	dev->ops->free(dev, out);
	tu_close(dev);
}
END_TEST

/* The CPU device's converters and engines/io's (safetensors, weight
 * streaming) share one definition of the rounding (engines/io/round.h);
 * their results must be the same bits. The sweep: every upper half
 * (sign, exponent, top 7 mantissa bits: all NaNs with a high payload, both
 * infinities, fp32 subnormals, every exponent of the f16 subnormal and
 * overflow ranges) with low halves at the rounding boundaries of both
 * formats (bf16 ties 0x8000, f16 ties 0x1000 of either parity, the bits
 * next to them, single bits for the f16 subnormal ties, all ones). The
 * counts check that the sweep holds each kind of input. */
START_TEST(convert_same_bits_as_io)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	uint16_t lows[80];
	int nlow = 0, k, j;
	int64_t n, i, nan = 0, inf = 0, sub32 = 0, sub16 = 0, tie_bf16 = 0, tie_f16 = 0;
	float *x;
	uint16_t *dev_bf, *dev_h, *io_bf, *io_h;

	lows[nlow++] = 0;
	lows[nlow++] = 0xffff;
	for (k = 0; k < 16; k++) {
		lows[nlow++] = (uint16_t)(1u << k);
		lows[nlow++] = (uint16_t)((1u << k) - 1 + (1u << k));   /* k+1 low ones */
		lows[nlow++] = (uint16_t)((1u << k) | 1u);
		lows[nlow++] = (uint16_t)(3u << k);
	}
	lows[nlow++] = 0x3000;   /* f16 tie with bit 13 set (odd) */
	lows[nlow++] = 0x7001;
	ck_assert_int_le(nlow, (int)(sizeof(lows) / sizeof(lows[0])));
	n = (int64_t)65536 * nlow;
	x = tu_falloc(dev, n);
	dev_bf = dev->ops->alloc(dev, (size_t)n * sizeof(uint16_t));
	dev_h = dev->ops->alloc(dev, (size_t)n * sizeof(uint16_t));
	io_bf = malloc((size_t)n * sizeof(uint16_t));
	io_h = malloc((size_t)n * sizeof(uint16_t));
	ck_assert(dev_bf && dev_h && io_bf && io_h);
	for (i = 0, k = 0; k < 65536; k++)
		for (j = 0; j < nlow; j++, i++) {
			uint32_t u = ((uint32_t)k << 16) | lows[j], a = u & 0x7fffffffu;
			double d = fabs((double)from_bits(u)) * 0x1p24;

			x[i] = from_bits(u);
			nan += a > 0x7f800000u;
			inf += a == 0x7f800000u;
			sub32 += a != 0 && a < 0x00800000u;
			sub16 += a >= 0x33000000u && a < 0x38800000u;
			tie_bf16 += a < 0x7f800000u && (u & 0xffffu) == 0x8000u;
			tie_f16 += (a >= 0x38800000u && a < 0x47800000u && (u & 0x1fffu) == 0x1000u) ||
				   (a < 0x38800000u && d - floor(d) == 0.5);
		}
	ck_assert_int_eq(i, n);
	ck_assert_int_gt(nan, 1000);
	ck_assert_int_eq(inf, 2);
	ck_assert_int_gt(sub32, 1000);
	ck_assert_int_gt(sub16, 1000);
	ck_assert_int_gt(tie_bf16, 1000);
	ck_assert_int_gt(tie_f16, 1000);

	ck_assert_int_eq(dev->k->to_bf16(dev, dev_bf, x, n), 0);
	ck_assert_int_eq(dev->k->to_f16(dev, dev_h, x, n), 0);
	f32_to_bf16_n(x, io_bf, (size_t)n);
	f32_to_f16_n(x, io_h, (size_t)n);
	/* Plain ifs: a Check assertion per element costs a system call. */
	for (i = 0; i < n; i++) {
		if (dev_bf[i] != io_bf[i] || dev_bf[i] != f32_to_bf16(x[i]))
			ck_abort_msg("bf16(0x%08x): device 0x%04x, io 0x%04x / 0x%04x",
				     to_bits(x[i]), dev_bf[i], io_bf[i], f32_to_bf16(x[i]));
		if (dev_h[i] != io_h[i] || dev_h[i] != f32_to_f16(x[i]))
			ck_abort_msg("f16(0x%08x): device 0x%04x, io 0x%04x / 0x%04x",
				     to_bits(x[i]), dev_h[i], io_h[i], f32_to_f16(x[i]));
	}
	/* Spot values of the sweep, so that agreeing on garbage fails too. */
	x[0] = from_bits(0x7f800001u);      /* signalling NaN: quiet, not inf */
	x[1] = from_bits(0x00008000u);      /* bf16 tie with 0 */
	x[2] = 0x1.8p-24f;                  /* f16 subnormal tie, odd: up */
	x[3] = 65520.0f;                    /* f16 overflow tie: inf */
	ck_assert_int_eq(dev->k->to_bf16(dev, dev_bf, x, 4), 0);
	ck_assert_int_eq(dev->k->to_f16(dev, dev_h, x, 4), 0);
	ck_assert_uint_eq(dev_bf[0], 0x7fc0);
	ck_assert_uint_eq(dev_bf[1], 0x0000);
	ck_assert_uint_eq(dev_h[2], 0x0002);
	ck_assert_uint_eq(dev_h[3], 0x7c00);
	ck_assert_uint_eq(f32_to_f16(x[0]), dev_h[0]);
	ck_assert_uint_eq(dev_h[0] & 0x7e00, 0x7e00);
	free(io_bf);
	free(io_h);
	dev->ops->free(dev, dev_bf);
	dev->ops->free(dev, dev_h);
	dev->ops->free(dev, x);
	tu_close(dev);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu_optim");
	TCase *tc = tcase_create("core");
	int failed = 0;

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, adamw_two_steps);
	tcase_add_test(tc, adamw_same_bits_wherever_an_element_lies);
	tcase_add_test(tc, sumsq_all_finite);
	tcase_add_test(tc, convert_bf16);
	tcase_add_test(tc, convert_f16);
	tcase_add_test(tc, convert_same_bits_as_io);
	suite_add_tcase(s, tc);
	tu_run(s, &failed);
	return failed ? 1 : 0;
}
