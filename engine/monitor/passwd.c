/*
 * passwd.c: basic-auth passwords against bcrypt hashes, through libxcrypt.
 *
 * Design note. crypt_rn computes the hash of the offered password with the stored hash's
 * setting (algorithm, cost, salt); the result is compared with the stored hash in constant time,
 * so the time taken says nothing about how much of it matched. Only bcrypt ($2y$, $2b$, $2a$) is
 * accepted: it is the one scheme of the exporter toolkit's basic_auth_users. libcrypt.a is linked
 * statically and kept out of the binary's exports, like OpenSSL (tls.c says why).
 *
 * Any thread: each call keeps its crypt state in its own allocation.
 */
#include "passwd.h"

#include <crypt.h>
#include <stdlib.h>
#include <string.h>

static int is_bcrypt(const char *h) {
  return strncmp(h, "$2y$", 4) == 0 || strncmp(h, "$2b$", 4) == 0 || strncmp(h, "$2a$", 4) == 0;
}

/* 1 when the n bytes of a and b are equal; the time does not depend on where they differ. */
static int same(const char *a, const char *b, size_t n) {
  volatile unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

/* Runs crypt_rn on `password` (len bytes, no NUL) with `setting` (a stored hash, or a new salt)
 * into out (outlen bytes). Returns 0, CM_EINVAL (crypt refused the setting or the result does not
 * fit) or CM_ENOMEM. The copies of the password are wiped before they are freed. */
static int run_crypt(const char *password, size_t len, const char *setting, char *out,
                     size_t outlen) {
  char *pw = malloc(len + 1);
  struct crypt_data *data = calloc(1, sizeof *data);
  int rc = CM_ENOMEM;
  if (pw != NULL && data != NULL) {
    memcpy(pw, password, len);
    pw[len] = '\0';
    const char *got = crypt_rn(pw, setting, data, (int)sizeof *data);
    if (got == NULL || got[0] == '*' || strlen(got) >= outlen) {
      rc = CM_EINVAL;
    } else {
      memcpy(out, got, strlen(got) + 1);
      rc = 0;
    }
    explicit_bzero(pw, len);
    explicit_bzero(data, sizeof *data);
  }
  free(pw);
  free(data);
  return rc;
}

int cm_passwd_check(const char *password, size_t len, const char *hash) {
  if (hash == NULL || !is_bcrypt(hash) || strlen(hash) != 60) return CM_EINVAL;
  /* A NUL would end the password for crypt: the bytes after it would not count. */
  if (memchr(password, '\0', len) != NULL) return 0;
  char got[CRYPT_OUTPUT_SIZE];
  int rc = run_crypt(password, len, hash, got, sizeof got);
  if (rc != 0) return rc;
  rc = strlen(got) == 60 && same(got, hash, 60) ? 1 : 0;
  explicit_bzero(got, sizeof got);
  return rc;
}

int cm_passwd_hash(const char *password, size_t len, int cost, char *out, size_t outlen) {
  if (cost < 4 || cost > 31 || outlen < 64 || memchr(password, '\0', len) != NULL) return CM_EINVAL;
  char setting[CRYPT_GENSALT_OUTPUT_SIZE];
  /* NULL entropy: libxcrypt draws the salt from the system's random source. */
  if (crypt_gensalt_rn("$2y$", (unsigned long)cost, NULL, 0, setting, sizeof setting) == NULL) {
    return CM_EIO;
  }
  int rc = run_crypt(password, len, setting, out, outlen);
  return rc == CM_EINVAL ? CM_EIO : rc;
}
