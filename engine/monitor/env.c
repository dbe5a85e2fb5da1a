/*
 * env.c: the monitor's tunables read from the environment (see env.h).
 *
 * Design note. The value is read with strtoull; trailing characters make the whole value the
 * default, so a typo never becomes a number.
 */
#include <stdlib.h>

#include "env.h"

uint64_t cm__env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  return *end ? dflt : (uint64_t)x;
}
