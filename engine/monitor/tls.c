/*
 * tls.c: TLS server connections over memory BIOs (OpenSSL), for the scripts' HTTP server.
 *
 * Design note. Each connection is an SSL object between two memory BIOs: the script puts the
 * ciphertext it read from its socket into the read BIO and writes what the write BIO holds to
 * its socket. OpenSSL never touches a file descriptor and never blocks, so the script's limits
 * (the request deadline, the byte bounds, the eviction of idle clients) apply to a connection
 * from its accept, through the handshake, to its answer.
 *
 * Linking. cuptimon-lua must depend on libc only (it runs as built here on the GPU machines), so
 * OpenSSL's libssl.a and libcrypto.a are linked statically, with their symbols kept out of the
 * binary's exports (--exclude-libs): a Lua C module that loads the system's libssl.so then gets
 * that library's own symbols, never a mix. Linking rather than dlopen: a node that lacks
 * libssl.so.3 (or has another major version) still serves TLS, and the binary holds exactly the
 * OpenSSL it was tested with. OpenSSL reads no configuration file (OPENSSL_INIT_NO_LOAD_CONFIG):
 * the web configuration file is the only thing that decides how TLS is served.
 *
 * Ownership: a server holds an SSL_CTX; each connection takes a reference to it (SSL_new), so a
 * server freed (a reload) while connections remain stays alive until the last one is freed.
 * Loop thread only.
 */
#include "tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

struct cm_tls_server {
  SSL_CTX *ctx;
};

struct cm_tls_conn {
  SSL *ssl;
  BIO *in;  /* ciphertext from the peer (owned by ssl) */
  BIO *out; /* ciphertext to the peer (owned by ssl) */
  int failed;
};

/* Formats OpenSSL's error queue (its oldest entry, the cause) after `what`, then clears it. */
static int ssl_fail(int rc, char *err, size_t errlen, const char *what) {
  unsigned long e = ERR_get_error();
  if (err != NULL && errlen > 0) {
    if (e != 0) {
      char buf[256];
      ERR_error_string_n(e, buf, sizeof buf);
      snprintf(err, errlen, "%s: %s", what, buf);
    } else {
      snprintf(err, errlen, "%s", what);
    }
  }
  ERR_clear_error();
  return rc;
}

/* RequestClientCert and RequireAnyClientCert take any certificate without checking it, as the
 * exporter toolkit does; the other modes keep OpenSSL's verdict. */
static int accept_any(int preverify, X509_STORE_CTX *x) {
  (void)preverify;
  (void)x;
  return 1;
}

static int init_once(void) {
  return OPENSSL_init_ssl(OPENSSL_INIT_NO_LOAD_CONFIG | OPENSSL_INIT_LOAD_SSL_STRINGS |
                              OPENSSL_INIT_LOAD_CRYPTO_STRINGS,
                          NULL) == 1;
}

int cm_tls_server_new(cm_tls_server **out, const cm_tls_options *o, char *err, size_t errlen) {
  char what[512];
  if (out == NULL || o == NULL || o->cert_file == NULL || o->key_file == NULL) {
    snprintf(err, errlen, "a certificate file and a key file are required");
    return CM_EINVAL;
  }
  *out = NULL;
  if (o->min_version < TLS1_2_VERSION || o->min_version > TLS1_3_VERSION ||
      (o->max_version != 0 && (o->max_version < o->min_version || o->max_version > TLS1_3_VERSION))) {
    snprintf(err, errlen, "the TLS versions must be 1.2 or 1.3, the minimum not above the maximum");
    return CM_EINVAL;
  }
  if (o->client_auth < CM_TLS_NO_CLIENT_CERT || o->client_auth > CM_TLS_REQUIRE_AND_VERIFY_CLIENT_CERT) {
    snprintf(err, errlen, "unknown client authentication mode %d", o->client_auth);
    return CM_EINVAL;
  }
  if (!init_once()) return ssl_fail(CM_EIO, err, errlen, "OpenSSL did not initialize");
  ERR_clear_error();
  cm_tls_server *s = calloc(1, sizeof *s);
  if (s == NULL) return CM_ENOMEM;
  s->ctx = SSL_CTX_new(TLS_server_method());
  if (s->ctx == NULL) {
    free(s);
    return ssl_fail(CM_ENOMEM, err, errlen, "SSL_CTX_new");
  }
  SSL_CTX *ctx = s->ctx;
  int rc = CM_EINVAL;
  SSL_CTX_set_min_proto_version(ctx, o->min_version);
  SSL_CTX_set_max_proto_version(ctx, o->max_version);
  /* No renegotiation (a client could make the server redo the costly part at will), no session
   * tickets (a scrape is one request on one connection; nothing to resume), no compression. */
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET | SSL_OP_NO_COMPRESSION |
                               (o->prefer_server_ciphers ? SSL_OP_CIPHER_SERVER_PREFERENCE : 0));
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  /* SSL_write may return after part of a record has been encrypted: the write BIO is memory and
   * never refuses, so this only allows records to be sized freely. */
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx, o->cert_file) != 1) {
    snprintf(what, sizeof what, "cert_file %s", o->cert_file);
    goto fail;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, o->key_file, SSL_FILETYPE_PEM) != 1) {
    snprintf(what, sizeof what, "key_file %s", o->key_file);
    goto fail;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    snprintf(what, sizeof what, "key_file %s does not match cert_file %s", o->key_file, o->cert_file);
    goto fail;
  }
  if (o->ciphers != NULL) {
    /* The standard (IANA) names, which the exporter toolkit's cipher_suites uses, become
     * OpenSSL's; a name OpenSSL does not know is refused, never dropped. */
    char list[2048] = "", name[128];
    const char *p = o->ciphers;
    while (*p != '\0') {
      size_t n = strcspn(p, ":");
      if (n == 0 || n >= sizeof name) {
        snprintf(what, sizeof what, "cipher_suites: an empty or overlong name");
        goto fail;
      }
      memcpy(name, p, n);
      name[n] = '\0';
      const char *ossl = OPENSSL_cipher_name(name);
      if (ossl == NULL || strcmp(ossl, "(NONE)") == 0) {
        snprintf(what, sizeof what, "cipher_suites: %s is not a TLS 1.2 cipher suite OpenSSL knows",
                 name);
        goto fail;
      }
      if (strlen(list) + strlen(ossl) + 2 > sizeof list) {
        snprintf(what, sizeof what, "cipher_suites: too many");
        goto fail;
      }
      if (list[0] != '\0') strcat(list, ":");
      strcat(list, ossl);
      p += n;
      if (*p == ':') p++;
    }
    if (SSL_CTX_set_cipher_list(ctx, list) != 1) {
      snprintf(what, sizeof what, "cipher_suites (%s)", o->ciphers);
      goto fail;
    }
  }
  if (o->groups != NULL && SSL_CTX_set1_groups_list(ctx, o->groups) != 1) {
    snprintf(what, sizeof what, "curve_preferences (%s)", o->groups);
    goto fail;
  }
  if (o->client_ca_file != NULL) {
    if (SSL_CTX_load_verify_locations(ctx, o->client_ca_file, NULL) != 1) {
      snprintf(what, sizeof what, "client_ca_file %s", o->client_ca_file);
      goto fail;
    }
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->client_ca_file);
    if (names == NULL) {
      snprintf(what, sizeof what, "client_ca_file %s holds no certificate", o->client_ca_file);
      goto fail;
    }
    SSL_CTX_set_client_CA_list(ctx, names);
  }
  switch (o->client_auth) {
  case CM_TLS_NO_CLIENT_CERT:
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    break;
  case CM_TLS_REQUEST_CLIENT_CERT:
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, accept_any);
    break;
  case CM_TLS_REQUIRE_ANY_CLIENT_CERT:
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, accept_any);
    break;
  case CM_TLS_VERIFY_CLIENT_CERT_IF_GIVEN:
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    break;
  default:
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    break;
  }
  ERR_clear_error();
  *out = s;
  return 0;
fail:
  rc = ssl_fail(rc, err, errlen, what);
  SSL_CTX_free(ctx);
  free(s);
  return rc;
}

void cm_tls_server_free(cm_tls_server *s) {
  if (s == NULL) return;
  SSL_CTX_free(s->ctx);
  free(s);
}

int cm_tls_conn_new(cm_tls_server *s, cm_tls_conn **out) {
  *out = NULL;
  cm_tls_conn *c = calloc(1, sizeof *c);
  if (c == NULL) return CM_ENOMEM;
  c->ssl = SSL_new(s->ctx);
  c->in = BIO_new(BIO_s_mem());
  c->out = BIO_new(BIO_s_mem());
  if (c->ssl == NULL || c->in == NULL || c->out == NULL) {
    BIO_free(c->in);
    BIO_free(c->out);
    SSL_free(c->ssl);
    free(c);
    ERR_clear_error();
    return CM_ENOMEM;
  }
  /* An empty read BIO means "more later", not end of file. */
  BIO_set_mem_eof_return(c->in, -1);
  SSL_set_bio(c->ssl, c->in, c->out);
  SSL_set_accept_state(c->ssl);
  *out = c;
  return 0;
}

void cm_tls_conn_free(cm_tls_conn *c) {
  if (c == NULL) return;
  SSL_free(c->ssl); /* frees both BIOs */
  free(c);
}

int cm_tls_conn_put(cm_tls_conn *c, const char *data, size_t len) {
  while (len > 0) {
    int n = BIO_write(c->in, data, len > 65536 ? 65536 : (int)len);
    if (n <= 0) {
      ERR_clear_error();
      return CM_ENOMEM;
    }
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

int cm_tls_conn_read(cm_tls_conn *c, char *buf, size_t cap, char *err, size_t errlen) {
  if (c->failed) {
    snprintf(err, errlen, "the connection has failed");
    return CM_EIO;
  }
  ERR_clear_error();
  int n = SSL_read(c->ssl, buf, cap > 65536 ? 65536 : (int)cap);
  if (n > 0) return n;
  int e = SSL_get_error(c->ssl, n);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    ERR_clear_error();
    return 0;
  }
  c->failed = 1;
  if (e == SSL_ERROR_ZERO_RETURN) {
    snprintf(err, errlen, "the client closed the TLS session");
    ERR_clear_error();
    return CM_EIO;
  }
  if (!SSL_is_init_finished(c->ssl)) {
    long v = SSL_get_verify_result(c->ssl);
    if (v != X509_V_OK) {
      char what[256];
      snprintf(what, sizeof what, "TLS handshake: client certificate refused (%s)",
               X509_verify_cert_error_string(v));
      return ssl_fail(CM_EIO, err, errlen, what);
    }
    return ssl_fail(CM_EIO, err, errlen, "TLS handshake");
  }
  return ssl_fail(CM_EIO, err, errlen, "TLS read");
}

int cm_tls_conn_write(cm_tls_conn *c, const char *data, size_t len, char *err, size_t errlen) {
  if (!SSL_is_init_finished(c->ssl)) {
    snprintf(err, errlen, "the TLS handshake is not done");
    return CM_ESTATE;
  }
  ERR_clear_error();
  while (len > 0) {
    int n = SSL_write(c->ssl, data, len > 65536 ? 65536 : (int)len);
    if (n <= 0) {
      c->failed = 1;
      return ssl_fail(CM_EIO, err, errlen, "TLS write");
    }
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

int cm_tls_conn_shutdown(cm_tls_conn *c) {
  if (!c->failed && SSL_is_init_finished(c->ssl)) SSL_shutdown(c->ssl);
  ERR_clear_error();
  return 0;
}

size_t cm_tls_conn_pending(const cm_tls_conn *c) { return BIO_ctrl_pending(c->out); }

size_t cm_tls_conn_get(cm_tls_conn *c, char *buf, size_t cap) {
  int n = BIO_read(c->out, buf, cap > 65536 ? 65536 : (int)cap);
  return n > 0 ? (size_t)n : 0;
}

int cm_tls_conn_established(const cm_tls_conn *c) { return SSL_is_init_finished(c->ssl) ? 1 : 0; }
