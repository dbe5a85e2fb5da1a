/*
 * tls.h: TLS server connections over memory buffers, for the HTTP server of the monitor's
 * scripts (lua/cuptimon/tls.lua binds these through ffi.C with the same declarations, which
 * spec/tls_spec.lua checks against this file).
 *
 * Design note. The socket stays the script's (a luv TCP handle on the host's loop): a connection
 * takes the ciphertext the script read (cm_tls_conn_put), gives back the plaintext (cm_tls_conn_read,
 * which also drives the handshake) and hands out the ciphertext to send (cm_tls_conn_get). So the
 * serving limits the script keeps on a plain connection (its timers, its byte bounds, its
 * eviction) hold before and during the handshake unchanged: nothing here reads a socket or
 * waits. Loop thread only, like the rest of the host; the functions report failures as 0 or a
 * negative CM_E* code with a message in the caller's buffer, and never print.
 */
#ifndef CM_TLS_H
#define CM_TLS_H

#include <stddef.h>

#include "cuptimon.h"

/* Who must show a client certificate: the values and meanings of the Prometheus exporter
 * toolkit's client_auth_type. */
typedef enum cm_tls_client_auth {
  CM_TLS_NO_CLIENT_CERT = 0,
  CM_TLS_REQUEST_CLIENT_CERT = 1,        /* asked for, not required, not verified */
  CM_TLS_REQUIRE_ANY_CLIENT_CERT = 2,    /* required, not verified */
  CM_TLS_VERIFY_CLIENT_CERT_IF_GIVEN = 3, /* verified against client_ca_file when given */
  CM_TLS_REQUIRE_AND_VERIFY_CLIENT_CERT = 4
} cm_tls_client_auth;

typedef struct cm_tls_options {
  const char *cert_file;      /* PEM certificate chain, required */
  const char *key_file;       /* PEM private key, required */
  const char *client_ca_file; /* PEM CA certificates for client certificates, or NULL */
  int client_auth;            /* cm_tls_client_auth */
  int min_version;            /* 0x0303 (TLS 1.2) or 0x0304 (TLS 1.3); nothing older */
  int max_version;            /* 0: the newest OpenSSL offers */
  const char *ciphers;        /* TLS 1.2 suites by standard (IANA) name, ':'-separated, or NULL */
  const char *groups;         /* OpenSSL group list ("X25519:P-256"), or NULL */
  int prefer_server_ciphers;  /* nonzero: the server's cipher order wins */
} cm_tls_options;

typedef struct cm_tls_server cm_tls_server;
typedef struct cm_tls_conn cm_tls_conn;

/* Builds a server context from `o`: reads and checks the certificate, the key (they must match)
 * and the client CA file. Returns 0 and *out, or CM_EINVAL/CM_EIO with the reason (naming the
 * file) in err. The caller frees *out with cm_tls_server_free; connections made from it keep it
 * alive until they are freed too. */
CM_EXTERN int cm_tls_server_new(cm_tls_server **out, const cm_tls_options *o, char *err,
                                size_t errlen);
CM_EXTERN void cm_tls_server_free(cm_tls_server *s);

/* A server connection of `s`. Returns 0 and *out, or CM_ENOMEM. */
CM_EXTERN int cm_tls_conn_new(cm_tls_server *s, cm_tls_conn **out);
CM_EXTERN void cm_tls_conn_free(cm_tls_conn *c);
/* Takes `len` bytes of ciphertext the peer sent. Returns 0 or CM_ENOMEM. The caller bounds what
 * it gives: the connection keeps whatever the handshake or read did not consume yet. */
CM_EXTERN int cm_tls_conn_put(cm_tls_conn *c, const char *data, size_t len);
/* Advances the handshake, then decrypts: returns the number of plaintext bytes written to buf
 * (at most cap), 0 when more ciphertext is needed first, or CM_EIO when the connection failed
 * (a failed handshake, a certificate refused, a protocol error), with OpenSSL's reason in err.
 * Either way, ciphertext may be waiting for cm_tls_conn_get (a handshake message, an alert). */
CM_EXTERN int cm_tls_conn_read(cm_tls_conn *c, char *buf, size_t cap, char *err, size_t errlen);
/* Encrypts `len` bytes of plaintext after the handshake. Returns 0, or CM_ESTATE before it is
 * done, or CM_EIO with the reason in err. */
CM_EXTERN int cm_tls_conn_write(cm_tls_conn *c, const char *data, size_t len, char *err,
                                size_t errlen);
/* Queues a close_notify alert. Returns 0 (a connection that already failed has nothing to add). */
CM_EXTERN int cm_tls_conn_shutdown(cm_tls_conn *c);
/* The number of ciphertext bytes waiting to be sent. */
CM_EXTERN size_t cm_tls_conn_pending(const cm_tls_conn *c);
/* Moves up to cap waiting ciphertext bytes into buf; returns how many. */
CM_EXTERN size_t cm_tls_conn_get(cm_tls_conn *c, char *buf, size_t cap);
/* 1 once the handshake has completed, else 0. */
CM_EXTERN int cm_tls_conn_established(const cm_tls_conn *c);

#endif
