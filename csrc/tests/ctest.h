/* ctest.h - a minimal test harness for the C core's unit tests. */
#ifndef CTEST_H
#define CTEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ctest_failures;

/* Count a failure; print only the first 20 so a broken invariant in a loop
 * does not bury the summary. */
static void ctest_fail(const char *file, int line, const char *what)
{
    if (ctest_failures++ < 20) fprintf(stderr, "%s:%d: %s\n", file, line, what);
}
static void ctest_fail_eq(const char *file, int line, const char *a, long long av, const char *b, long long bv)
{
    if (ctest_failures++ < 20)
        fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", file, line, a, av, b, bv);
}
#define CHECK(cond) do { if (!(cond)) ctest_fail(__FILE__, __LINE__, "CHECK failed: " #cond); } while (0)
#define CHECK_EQ(a, b) do { long long _a = (long long)(a), _b = (long long)(b); \
    if (_a != _b) ctest_fail_eq(__FILE__, __LINE__, #a, _a, #b, _b); } while (0)
#define REQUIRE(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); exit(1); } } while (0)

#define RUN(fn) do { int _before = ctest_failures; fn(); \
    printf("%-40s %s\n", #fn, ctest_failures == _before ? "ok" : "FAILED"); } while (0)
#define CTEST_END() do { if (ctest_failures) { printf("%d failure(s)\n", ctest_failures); return 1; } \
    printf("all passed\n"); return 0; } while (0)

/* Deterministic PRNG (xorshift64*) so failures reproduce. */
static unsigned long long ctest_rng = 0x9E3779B97F4A7C15ull;
static inline unsigned long long rnd(void)
{
    ctest_rng ^= ctest_rng >> 12; ctest_rng ^= ctest_rng << 25; ctest_rng ^= ctest_rng >> 27;
    return ctest_rng * 2685821657736338717ull;
}
static inline unsigned rndn(unsigned n) { return (unsigned)(rnd() % n); }
#endif
