/* cpu_test_util.h — helpers shared by the CPU-device kernel tests:
 * a seeded random generator, device set-up and error measures. Header-only
 * (static functions) so each test binary stays one .c file. */
#ifndef ENGINED_CPU_TEST_UTIL_H
#define ENGINED_CPU_TEST_UTIL_H

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"

/* splitmix64: reproducible across platforms. */
static uint64_t tu_state = 0x1234567887654321ull;

static inline void tu_seed(uint64_t s)
{
	tu_state = s;
}

static inline uint64_t tu_u64(void)
{
	uint64_t z = (tu_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline float tu_uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)(tu_u64() >> 11) * 0x1.0p-53);
}

static inline void tu_fill(float *x, int64_t n, float lo, float hi)
{
	int64_t i;

	for (i = 0; i < n; i++)
		x[i] = tu_uniform(lo, hi);
}

/* Open the CPU device (2 threads unless told otherwise) or fail the test. */
static inline struct device *tu_open(int threads, enum matmul_precision prec)
{
	const struct device_ops *ops = device_find("cpu");
	struct device *dev = NULL;

	ck_assert_ptr_nonnull(ops);
	ck_assert_int_eq(ops->open(&dev, threads, prec), 0);
	ck_assert_ptr_nonnull(dev);
	return dev;
}

static inline void tu_close(struct device *dev)
{
	dev->ops->close(dev);
}

/* Device buffer of n floats (CPU device memory is host memory). */
static inline float *tu_falloc(struct device *dev, int64_t n)
{
	float *p = dev->ops->alloc(dev, (size_t)(n > 0 ? n : 1) * sizeof(float));

	ck_assert_ptr_nonnull(p);
	return p;
}

/* max |got - want| / (abs_tol + rel_tol * |want|) over n elements; <= 1
 * means every element is within tolerance. */
static inline double tu_err_f(const float *got, const double *want, int64_t n,
			      double abs_tol, double rel_tol)
{
	double worst = 0.0;
	int64_t i;

	for (i = 0; i < n; i++) {
		double e = fabs((double)got[i] - want[i]) /
			   (abs_tol + rel_tol * fabs(want[i]));

		if (!(e <= worst))
			worst = e;   /* also catches NaN */
	}
	return worst;
}

/* Largest |x| of a double array (scale for gradient tolerances). */
static inline double tu_maxabs(const double *x, int64_t n)
{
	double m = 0.0;
	int64_t i;

	for (i = 0; i < n; i++)
		m = fabs(x[i]) > m ? fabs(x[i]) : m;
	return m;
}

static inline void tu_run(Suite *s, int *failed)
{
	SRunner *sr = srunner_create(s);

	srunner_run_all(sr, CK_NORMAL);
	*failed += srunner_ntests_failed(sr);
	srunner_free(sr);
}

#endif
