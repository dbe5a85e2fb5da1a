/*
 * passwd.h: the bcrypt check of basic-auth passwords (and the hash an operator writes into a web
 * configuration file), for the HTTP server of the monitor's scripts (lua/cuptimon/passwd.lua
 * binds these through ffi.C).
 *
 * Design note. The hashing is libxcrypt's (crypt_rn, crypt_gensalt_rn), never hand-written; the
 * comparison of the computed and the stored hash takes the same time wherever they differ. Any
 * thread: the functions keep no state.
 */
#ifndef CM_PASSWD_H
#define CM_PASSWD_H

#include <stddef.h>

#include "cuptimon.h"

/* Checks a basic-auth password against a bcrypt hash ($2y$, $2b$ or $2a$, as htpasswd -B and
 * the exporter toolkit's documentation make them) with libxcrypt's crypt_rn, comparing in constant
 * time. Returns 1 when it matches, 0 when it does not, CM_EINVAL when `hash` is not a bcrypt
 * hash crypt accepts. Costs what the hash's cost factor says (about 2^cost bcrypt rounds). */
CM_EXTERN int cm_passwd_check(const char *password, size_t len, const char *hash);
/* Writes a new bcrypt ($2y$) hash of `password` with cost `cost` (4..31) and a random salt into
 * out (at least 64 bytes). Returns 0, or CM_EINVAL (a bad cost, a NUL in the password, out too
 * small) or CM_EIO (no random salt). */
CM_EXTERN int cm_passwd_hash(const char *password, size_t len, int cost, char *out, size_t outlen);

#endif
