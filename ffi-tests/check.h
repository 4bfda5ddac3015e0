/* Tiny check macros shared by the C and C++ consumers. */
#ifndef RDMX_FFI_CHECK_H
#define RDMX_FFI_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures = 0;
static int check_count = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    check_count++;                                                           \
    if (!(cond)) {                                                           \
      check_failures++;                                                      \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                        \
  } while (0)

/* A call's status equals `want` and rdmx_last_error() contains every given fragment. */
#define CHECK_STATUS(call, want)                                             \
  do {                                                                       \
    rdmx_status got_ = (call);                                               \
    check_count++;                                                           \
    if (got_ != (want)) {                                                    \
      check_failures++;                                                      \
      fprintf(stderr, "%s:%d: %s returned %s, want %s (last error: %s)\n",   \
              __FILE__, __LINE__, #call, rdmx_status_str((int)got_),         \
              rdmx_status_str((int)(want)), rdmx_last_error());              \
    }                                                                        \
  } while (0)

#define CHECK_ERR_HAS(fragment)                                              \
  do {                                                                       \
    check_count++;                                                           \
    if (strstr(rdmx_last_error(), (fragment)) == NULL) {                     \
      check_failures++;                                                      \
      fprintf(stderr, "%s:%d: last error '%s' lacks '%s'\n", __FILE__,       \
              __LINE__, rdmx_last_error(), (fragment));                      \
    }                                                                        \
  } while (0)

#define CHECK_STREQ(a, b)                                                    \
  do {                                                                       \
    const char *a_ = (a), *b_ = (b);                                         \
    check_count++;                                                           \
    if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0) {                   \
      check_failures++;                                                      \
      fprintf(stderr, "%s:%d: '%s' != '%s'\n", __FILE__, __LINE__,           \
              a_ ? a_ : "(null)", b_ ? b_ : "(null)");                       \
    }                                                                        \
  } while (0)

#define CHECK_DONE(name)                                                     \
  do {                                                                       \
    printf("%s: %d checks, %d failed\n", (name), check_count,                \
           check_failures);                                                  \
    return check_failures == 0 ? 0 : 1;                                      \
  } while (0)

#endif
