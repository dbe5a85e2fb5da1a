/*
 * json.c: the small JSON tree behind correlation metadata.
 *
 * Design. A document is parsed into a tree of nodes (bounded size and depth; invalid text is
 * rejected with its byte offset). Strings and numbers are validated and kept as their source
 * text, so nothing is lost or reformatted, and object keys are compared as that text. Two trees
 * merge recursively, and a tree is written back as compact JSON.
 *
 * Nothing here locks: a tree belongs to one caller at a time (correlation.c holds its lock).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_internal.h"

enum { J_NULL, J_TRUE, J_FALSE, J_NUM, J_STR, J_ARR, J_OBJ };

/* A parsed value. Scalars keep their source text (strings with their quotes and escapes), object
 * members keep their key's source text, and containers list their children in order. */
struct cm__json {
  int type;
  char *key; /* member key as source text with quotes, or NULL outside an object */
  size_t klen;
  char *text; /* J_NUM and J_STR: source text */
  size_t tlen;
  struct cm__json *child, *last;
  struct cm__json *next;
};
typedef struct cm__json jnode;

void cm__json_free(jnode *n) {
  while (n) {
    jnode *nx = n->next;
    cm__json_free(n->child);
    free(n->key);
    free(n->text);
    free(n);
    n = nx;
  }
}

typedef struct jparser {
  const char *s;
  size_t len, pos;
  int depth;
  int err;         /* 0, CM_EINVAL or CM_ENOMEM */
  const char *why; /* for CM_EINVAL */
} jparser;

static void jfail(jparser *p, const char *why) {
  if (!p->err) {
    p->err = CM_EINVAL;
    p->why = why;
  }
}

static void jws(jparser *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->pos++;
  }
}

static char *dupn(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static int ishex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Scans a string token at p->pos; returns its length including quotes, or 0 on error. */
static size_t jscan_string(jparser *p) {
  size_t i = p->pos;
  if (i >= p->len || p->s[i] != '"') return jfail(p, "expected a string"), 0;
  i++;
  while (i < p->len) {
    unsigned char c = (unsigned char)p->s[i];
    if (c == '"') return i + 1 - p->pos;
    if (c < 0x20) return jfail(p, "control character in a string"), 0;
    if (c == '\\') {
      if (i + 1 >= p->len) break;
      char e = p->s[i + 1];
      if (e == 'u') {
        if (i + 5 >= p->len || !ishex(p->s[i + 2]) || !ishex(p->s[i + 3]) || !ishex(p->s[i + 4]) ||
            !ishex(p->s[i + 5]))
          return jfail(p, "bad \\u escape"), 0;
        i += 6;
        continue;
      }
      if (!strchr("\"\\/bfnrt", e) || e == '\0') return jfail(p, "bad escape"), 0;
      i += 2;
      continue;
    }
    i++;
  }
  jfail(p, "unterminated string");
  return 0;
}

/* Scans a number token per RFC 8259; returns its length, or 0 on error. */
static size_t jscan_number(jparser *p) {
  size_t i = p->pos;
  const char *s = p->s;
  if (i < p->len && s[i] == '-') i++;
  if (i >= p->len) return jfail(p, "bad number"), 0;
  if (s[i] == '0') {
    i++;
  } else if (s[i] >= '1' && s[i] <= '9') {
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  } else {
    return jfail(p, "bad number"), 0;
  }
  if (i < p->len && s[i] == '.') {
    i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') return jfail(p, "bad fraction"), 0;
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  }
  if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') return jfail(p, "bad exponent"), 0;
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  }
  return i - p->pos;
}

static jnode *jnew(jparser *p, int type) {
  jnode *n = calloc(1, sizeof *n);
  if (!n && !p->err) p->err = CM_ENOMEM;
  if (n) n->type = type;
  return n;
}


/* Adds `m` to object `o`: a key seen before is merged into (later value wins on a leaf). */
static void jobj_add(jnode *o, jnode *m) {
  for (jnode **pp = &o->child; *pp; pp = &(*pp)->next) {
    jnode *c = *pp;
    if (c->klen == m->klen && memcmp(c->key, m->key, m->klen) == 0) {
      jnode *nx = c->next;
      c->next = NULL;
      jnode *r = cm__json_merge(c, m);
      r->next = nx;
      *pp = r;
      if (!nx) o->last = r;
      return;
    }
  }
  if (o->last)
    o->last->next = m;
  else
    o->child = m;
  o->last = m;
}

static jnode *jvalue(jparser *p) {
  jws(p);
  if (p->pos >= p->len) return jfail(p, "unexpected end of input"), NULL;
  char c = p->s[p->pos];
  if (c == '{' || c == '[') {
    if (++p->depth > CM_CORR_MAX_NESTING) return jfail(p, "nesting too deep"), NULL;
    jnode *n = jnew(p, c == '{' ? J_OBJ : J_ARR);
    if (!n) return NULL;
    char close = c == '{' ? '}' : ']';
    p->pos++;
    jws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
      p->pos++;
      p->depth--;
      return n;
    }
    for (;;) {
      char *key = NULL;
      size_t klen = 0;
      if (n->type == J_OBJ) {
        jws(p);
        klen = jscan_string(p);
        if (!klen) break;
        key = dupn(p->s + p->pos, klen);
        if (!key) {
          p->err = CM_ENOMEM;
          break;
        }
        p->pos += klen;
        jws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
          free(key);
          jfail(p, "expected ':'");
          break;
        }
        p->pos++;
      }
      jnode *v = jvalue(p);
      if (!v) {
        free(key);
        break;
      }
      if (n->type == J_OBJ) {
        v->key = key;
        v->klen = klen;
        jobj_add(n, v);
      } else {
        if (n->last)
          n->last->next = v;
        else
          n->child = v;
        n->last = v;
      }
      jws(p);
      if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        continue;
      }
      if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        p->depth--;
        return n;
      }
      jfail(p, n->type == J_OBJ ? "expected ',' or '}'" : "expected ',' or ']'");
      break;
    }
    cm__json_free(n);
    return NULL;
  }
  if (c == '"' || c == '-' || (c >= '0' && c <= '9')) {
    size_t l = c == '"' ? jscan_string(p) : jscan_number(p);
    if (!l) return NULL;
    jnode *n = jnew(p, c == '"' ? J_STR : J_NUM);
    if (!n) return NULL;
    n->text = dupn(p->s + p->pos, l);
    if (!n->text) {
      p->err = CM_ENOMEM;
      free(n);
      return NULL;
    }
    n->tlen = l;
    p->pos += l;
    return n;
  }
  static const struct {
    const char *w;
    int type;
  } words[] = {{"null", J_NULL}, {"true", J_TRUE}, {"false", J_FALSE}};
  for (size_t i = 0; i < 3; i++) {
    size_t wl = strlen(words[i].w);
    if (p->len - p->pos >= wl && memcmp(p->s + p->pos, words[i].w, wl) == 0) {
      p->pos += wl;
      return jnew(p, words[i].type);
    }
  }
  jfail(p, "unexpected character");
  return NULL;
}

jnode *cm__json_parse(const char *s, size_t len, int *rc) {
  jparser p = {.s = s, .len = len};
  jnode *n = jvalue(&p);
  if (n) {
    jws(&p);
    if (p.pos != p.len) {
      jfail(&p, "trailing characters after the value");
      cm__json_free(n);
      n = NULL;
    }
  }
  if (!n) {
    if (p.err == CM_ENOMEM) {
      *rc = cm__seterr(CM_ENOMEM, "out of memory parsing metadata");
    } else {
      *rc = cm__seterr(CM_EINVAL, "invalid JSON metadata at byte %zu: %s", p.pos,
                       p.why ? p.why : "syntax error");
    }
  }
  return n;
}

jnode *cm__json_merge(jnode *dst, jnode *src) {
  if (dst->type == J_OBJ && src->type == J_OBJ) {
    jnode *c = src->child;
    src->child = src->last = NULL;
    while (c) {
      jnode *nx = c->next;
      c->next = NULL;
      jobj_add(dst, c);
      c = nx;
    }
    cm__json_free(src);
    return dst;
  }
  free(src->key);
  src->key = dst->key;
  src->klen = dst->klen;
  dst->key = NULL;
  dst->next = NULL;
  cm__json_free(dst);
  return src;
}

void cm__sbuf_put(cm__sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

void cm__json_write(cm__sbuf *b, const jnode *n) {
  switch (n->type) {
  case J_NULL: cm__sbuf_put(b, "null", 4); break;
  case J_TRUE: cm__sbuf_put(b, "true", 4); break;
  case J_FALSE: cm__sbuf_put(b, "false", 5); break;
  case J_NUM:
  case J_STR: cm__sbuf_put(b, n->text, n->tlen); break;
  default: {
    bool obj = n->type == J_OBJ;
    cm__sbuf_put(b, obj ? "{" : "[", 1);
    for (const jnode *c = n->child; c; c = c->next) {
      if (c != n->child) cm__sbuf_put(b, ",", 1);
      if (obj) {
        cm__sbuf_put(b, c->key, c->klen);
        cm__sbuf_put(b, ":", 1);
      }
      cm__json_write(b, c);
    }
    cm__sbuf_put(b, obj ? "}" : "]", 1);
  }
  }
}
