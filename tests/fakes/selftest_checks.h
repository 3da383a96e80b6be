// The checks of the fakes' self-tests (xpurt/fake_xpurt_selftest.cc,
// xdnn/fake_xdnn_selftest.cc): plain C++, no test framework. The including
// file defines `g_failures` (a counter: an int, or a std::atomic<int> where
// checks run on several threads) before including this, and exits non-zero
// when it is not 0.
//
//   CHECK(cond)          counts a failure and goes on
//   CHECK_RC(expr, want) counts a failure when expr's return code is not want
//   REQUIRE(cond)        exits at once: what follows cannot run without it
#ifndef FLAGOS_TESTS_FAKES_SELFTEST_CHECKS_H_
#define FLAGOS_TESTS_FAKES_SELFTEST_CHECKS_H_

#include <cstdio>
#include <cstdlib>

#define CHECK(cond)                                                                \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                \
    }                                                                              \
  } while (0)

#define CHECK_RC(expr, want)                                                                      \
  do {                                                                                            \
    const int rc_ = (expr);                                                                       \
    if (rc_ != (want)) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s returned %d, want %d\n", __FILE__, __LINE__, #expr, rc_,    \
                   static_cast<int>(want));                                                       \
      ++g_failures;                                                                               \
    }                                                                                             \
  } while (0)

#define REQUIRE(cond)                                                                \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

#endif  // FLAGOS_TESTS_FAKES_SELFTEST_CHECKS_H_
