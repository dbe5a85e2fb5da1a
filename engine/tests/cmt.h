/*
 * cmt.h: the tiny assertion kit of the C tests. Each test is its own process (ctest runs it with
 * a timeout). An assertion that fails prints the expression, both operands and the location, then
 * aborts. CMT_SKIP exits with 77, which ctest reports as skipped.
 */
#ifndef CMT_H
#define CMT_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMT_FAIL(...)                                                              \
  do {                                                                             \
    fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                          \
    fprintf(stderr, __VA_ARGS__);                                                  \
    fprintf(stderr, "\n");                                                         \
    abort();                                                                       \
  } while (0)

#define CMT_ASSERT(expr)                                                           \
  do {                                                                             \
    if (!(expr)) CMT_FAIL("%s", #expr);                                            \
  } while (0)

#define CMT_OP(a, op, b, T, fmt)                                                   \
  do {                                                                             \
    T cmt_a_ = (T)(a), cmt_b_ = (T)(b);                                            \
    if (!(cmt_a_ op cmt_b_))                                                       \
      CMT_FAIL("%s %s %s (%" fmt " vs %" fmt ")", #a, #op, #b, cmt_a_, cmt_b_);    \
  } while (0)

#define CMT_EQ(a, b) CMT_OP(a, ==, b, int64_t, PRId64)
#define CMT_NE(a, b) CMT_OP(a, !=, b, int64_t, PRId64)
#define CMT_LT(a, b) CMT_OP(a, <, b, int64_t, PRId64)
#define CMT_LE(a, b) CMT_OP(a, <=, b, int64_t, PRId64)
#define CMT_GT(a, b) CMT_OP(a, >, b, int64_t, PRId64)
#define CMT_GE(a, b) CMT_OP(a, >=, b, int64_t, PRId64)
#define CMT_EQU(a, b) CMT_OP(a, ==, b, uint64_t, PRIu64)
#define CMT_LEU(a, b) CMT_OP(a, <=, b, uint64_t, PRIu64)

#define CMT_OK(call)                                                               \
  do {                                                                             \
    int cmt_rc_ = (call);                                                          \
    if (cmt_rc_ != 0)                                                              \
      CMT_FAIL("%s returned %d (%s: %s)", #call, cmt_rc_, cm_err_name(cmt_rc_),    \
               cm_errmsg());                                                       \
  } while (0)

#define CMT_STREQ(a, b)                                                            \
  do {                                                                             \
    const char *cmt_a_ = (a), *cmt_b_ = (b);                                       \
    if (!cmt_a_ || !cmt_b_ || strcmp(cmt_a_, cmt_b_) != 0)                         \
      CMT_FAIL("%s == %s (\"%s\" vs \"%s\")", #a, #b, cmt_a_ ? cmt_a_ : "(null)",  \
               cmt_b_ ? cmt_b_ : "(null)");                                        \
  } while (0)

#define CMT_CONTAINS(hay, needle)                                                  \
  do {                                                                             \
    const char *cmt_h_ = (hay), *cmt_n_ = (needle);                                \
    if (!cmt_h_ || !strstr(cmt_h_, cmt_n_))                                        \
      CMT_FAIL("%s contains \"%s\" (got \"%s\")", #hay, cmt_n_, cmt_h_ ? cmt_h_ : "(null)"); \
  } while (0)

#define CMT_SKIP(why)                                                              \
  do {                                                                             \
    printf("SKIP: %s\n", why);                                                     \
    exit(77);                                                                      \
  } while (0)

#endif /* CMT_H */
