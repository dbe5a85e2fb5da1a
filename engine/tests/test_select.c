/*
 * test_select.c: selections, their text form, and cm_batch_column.
 *
 * Every failing call is checked to leave the selection byte-for-byte as it was, and its detail
 * to name the bad token and the valid choices.
 */
#include "cm_internal.h"
#include "cmt.h"

#define CK CM_KIND_CONCURRENT_KERNEL

static int fid(int kind, const char *name) {
  int id = cm_field_by_name(kind, name);
  if (id < 0) CMT_FAIL("no field %s of kind %d: %s", name, kind, cm_errmsg());
  return id;
}

/* The total number of selected fields over every kind value. */
static int total(const cm_selection *s) {
  int n = 0;
  for (int k = 0; k < CM_KIND_MAX; k++) n += cm_selection_count(s, k);
  return n;
}

/* Asserts that `s` equals the snapshot `snap`. */
#define CMT_UNCHANGED(s, snap) CMT_ASSERT(memcmp((s), (snap), sizeof *(s)) == 0)

static void test_add(void) {
  cm_selection *s = NULL;
  CMT_EQ(cm_selection_new(NULL), CM_EINVAL);
  CMT_OK(cm_selection_new(&s));
  CMT_ASSERT(s != NULL);
  CMT_EQ(total(s), 0);

  CMT_OK(cm_selection_add(s, "kernel", "name"));
  CMT_EQ(cm_selection_has(s, CK, fid(CK, "name")), 1);
  CMT_EQ(cm_selection_has(s, CK, fid(CK, "start")), 0);
  CMT_EQ(cm_selection_count(s, CK), 1);
  CMT_OK(cm_selection_add(s, "concurrent_kernel", "start"));
  CMT_OK(cm_selection_add(s, "kernel", "start")); /* adding twice is idempotent */
  CMT_EQ(cm_selection_count(s, CK), 2);
  CMT_EQ(cm_selection_count(s, CM_KIND_KERNEL), 0); /* kernel_serial is a different kind */

  CMT_OK(cm_selection_add(s, "memcpy", NULL));
  CMT_EQ(cm_selection_count(s, CM_KIND_MEMCPY), cm_field_count(CM_KIND_MEMCPY));
  CMT_OK(cm_selection_add(s, "memcpy_p2p", "all"));
  CMT_EQ(cm_selection_count(s, CM_KIND_MEMCPY2), cm_field_count(CM_KIND_MEMCPY2));
  for (int i = 0; i < cm_field_count(CM_KIND_MEMCPY2); i++)
    CMT_EQ(cm_selection_has(s, CM_KIND_MEMCPY2, i), 1);
  CMT_EQ(cm_selection_has(s, CM_KIND_MEMCPY2, cm_field_count(CM_KIND_MEMCPY2)), 0);

  /* Failures change nothing and say what is valid. */
  cm_selection snap = *s;
  CMT_EQ(cm_selection_add(s, "kernal", "name"), CM_ENOKIND);
  CMT_CONTAINS(cm_errmsg(), "unknown kind 'kernal'");
  CMT_CONTAINS(cm_errmsg(), "concurrent_kernel (kernel)");
  CMT_UNCHANGED(s, &snap);
  CMT_EQ(cm_selection_add(s, "kernel", "strt"), CM_ENOFIELD);
  CMT_CONTAINS(cm_errmsg(), "unknown field 'strt' of kind concurrent_kernel; valid fields:");
  CMT_CONTAINS(cm_errmsg(), "start");
  CMT_UNCHANGED(s, &snap);
  CMT_EQ(cm_selection_add(s, NULL, "name"), CM_ENOKIND);
  CMT_EQ(cm_selection_add(s, "kernel", "ALL"), CM_ENOFIELD);
  CMT_UNCHANGED(s, &snap);
  CMT_EQ(cm_selection_add(NULL, "kernel", "name"), CM_EINVAL);

  /* By id. */
  CMT_OK(cm_selection_add_id(s, CM_KIND_RUNTIME, fid(CM_KIND_RUNTIME, "cbid")));
  CMT_EQ(cm_selection_count(s, CM_KIND_RUNTIME), 1);
  CMT_OK(cm_selection_add_id(s, CM_KIND_DRIVER, -1));
  CMT_EQ(cm_selection_count(s, CM_KIND_DRIVER), cm_field_count(CM_KIND_DRIVER));
  snap = *s;
  CMT_EQ(cm_selection_add_id(s, CM_KIND_RUNTIME, cm_field_count(CM_KIND_RUNTIME)), CM_ENOFIELD);
  CMT_CONTAINS(cm_errmsg(), "of kind runtime out of range");
  CMT_EQ(cm_selection_add_id(s, CM_KIND_RUNTIME, -2), CM_ENOFIELD);
  CMT_EQ(cm_selection_add_id(s, CM_KIND_RUNTIME, CM__MAX_FIELDS), CM_ENOFIELD);
  CMT_EQ(cm_selection_add_id(s, 6, 0), CM_ENOKIND);
  CMT_CONTAINS(cm_errmsg(), "unknown activity kind 6");
  CMT_EQ(cm_selection_add_id(s, -1, -1), CM_ENOKIND);
  CMT_EQ(cm_selection_add_id(s, CM_KIND_MAX, -1), CM_ENOKIND);
  CMT_EQ(cm_selection_add_id(NULL, CM_KIND_RUNTIME, 0), CM_EINVAL);
  CMT_UNCHANGED(s, &snap);

  /* Queries with out-of-range arguments answer 0 rather than reading out of bounds. */
  CMT_EQ(cm_selection_has(s, -1, 0), 0);
  CMT_EQ(cm_selection_has(s, CM_KIND_MAX, 0), 0);
  CMT_EQ(cm_selection_has(s, CK, -1), 0);
  CMT_EQ(cm_selection_has(s, CK, CM__MAX_FIELDS), 0);
  CMT_EQ(cm_selection_has(NULL, CK, 0), 0);
  CMT_EQ(cm_selection_count(s, -1), 0);
  CMT_EQ(cm_selection_count(s, CM_KIND_MAX), 0);
  CMT_EQ(cm_selection_count(s, 6), 0);
  CMT_EQ(cm_selection_count(NULL, CK), 0);

  cm_selection_free(s);
  cm_selection_free(NULL);
}

static void test_parse(void) {
  cm_selection *s;
  CMT_OK(cm_selection_new(&s));

  CMT_OK(cm_selection_parse(s, "kernel:name,start,stop;memcpy:all;runtime"));
  CMT_EQ(cm_selection_count(s, CK), 3);
  CMT_EQ(cm_selection_has(s, CK, fid(CK, "name")), 1);
  CMT_EQ(cm_selection_has(s, CK, fid(CK, "stop")), 1);
  CMT_EQ(cm_selection_has(s, CK, fid(CK, "device")), 0);
  CMT_EQ(cm_selection_count(s, CM_KIND_MEMCPY), cm_field_count(CM_KIND_MEMCPY));
  CMT_EQ(cm_selection_count(s, CM_KIND_RUNTIME), cm_field_count(CM_KIND_RUNTIME));
  CMT_EQ(total(s), 3 + cm_field_count(CM_KIND_MEMCPY) + cm_field_count(CM_KIND_RUNTIME));

  /* Spaces around tokens, empty entries and aliases. */
  cm_selection *t;
  CMT_OK(cm_selection_new(&t));
  CMT_OK(cm_selection_parse(t, "  sync : start , stop ;; marker ;\tmemcpy_p2p:bytes\n;"));
  CMT_EQ(cm_selection_count(t, CM_KIND_SYNCHRONIZATION), 2);
  CMT_EQ(cm_selection_count(t, CM_KIND_MARKER), cm_field_count(CM_KIND_MARKER));
  CMT_EQ(cm_selection_count(t, CM_KIND_MEMCPY2), 1);
  CMT_EQ(cm_selection_has(t, CM_KIND_MEMCPY2, fid(CM_KIND_MEMCPY2, "bytes")), 1);
  int before = total(t);
  CMT_OK(cm_selection_parse(t, ""));
  CMT_OK(cm_selection_parse(t, " ; "));
  CMT_EQ(total(t), before);
  /* "all" inside a list, mixed with names. */
  CMT_OK(cm_selection_parse(t, "kernel_serial:name,all"));
  CMT_EQ(cm_selection_count(t, CM_KIND_KERNEL), cm_field_count(CM_KIND_KERNEL));
  /* Parsing adds to what is there. */
  CMT_OK(cm_selection_parse(s, "kernel:device"));
  CMT_EQ(cm_selection_count(s, CK), 4);

  /* Failures leave the selection untouched, even when earlier entries were valid. */
  cm_selection snap = *s;
  static const struct {
    const char *spec;
    int err;
    const char *detail1, *detail2;
  } bad[] = {
      {"kernel:name,strt", CM_ENOFIELD, "unknown field 'strt' of kind concurrent_kernel",
       "valid fields: cache_config"},
      {"memset;kernal:name", CM_ENOKIND, "unknown kind 'kernal'", "valid kinds: concurrent_kernel"},
      {"memset;bogus", CM_ENOKIND, "offset 7: unknown kind 'bogus'", "environment"},
      {"Kernel", CM_ENOKIND, "'Kernel'", "kernel_serial"},
      {"kernel:", CM_EINVAL, "empty field name", "concurrent_kernel"},
      {"kernel:name,,stop", CM_EINVAL, "offset 12: empty field name", "concurrent_kernel"},
      {"kernel:name,", CM_EINVAL, "empty field name", "concurrent_kernel"},
      {":name", CM_EINVAL, "missing kind name", "offset 0"},
      {"kernel:name:stop", CM_ENOFIELD, "'name:stop'", "valid fields"},
      {"kernel:na me", CM_ENOFIELD, "'na me'", "valid fields"},
      {"memcpy:end", CM_ENOFIELD, "'end' of kind memcpy", "stop"},
      {"kernel:xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
       "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
       CM_EINVAL, "field name too long", "offset 7"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cm__clearerr();
    int rc = cm_selection_parse(s, bad[i].spec);
    if (rc != bad[i].err)
      CMT_FAIL("parse(\"%s\") returned %d (%s), want %d: %s", bad[i].spec, rc, cm_err_name(rc),
               bad[i].err, cm_errmsg());
    CMT_CONTAINS(cm_errmsg(), bad[i].detail1);
    CMT_CONTAINS(cm_errmsg(), bad[i].detail2);
    CMT_UNCHANGED(s, &snap);
  }
  CMT_EQ(cm_selection_count(s, CM_KIND_MEMSET), 0);
  CMT_EQ(cm_selection_parse(s, NULL), CM_EINVAL);
  CMT_EQ(cm_selection_parse(NULL, "kernel"), CM_EINVAL);
  CMT_UNCHANGED(s, &snap);

  /* Every kind parses by its name, and "kind:all" equals "kind". */
  int n = 0;
  const cm__kind_desc *d = cm__kind_descs(&n);
  for (int i = 0; i < n; i++) {
    cm_selection *a, *b;
    char spec[128];
    CMT_OK(cm_selection_new(&a));
    CMT_OK(cm_selection_new(&b));
    CMT_OK(cm_selection_parse(a, d[i].name));
    snprintf(spec, sizeof spec, "%s:all", d[i].name);
    CMT_OK(cm_selection_parse(b, spec));
    CMT_EQ(cm_selection_count(a, d[i].kind), d[i].nfields);
    CMT_EQ(total(a), d[i].nfields);
    CMT_ASSERT(memcmp(a, b, sizeof *a) == 0);
    cm_selection_free(a);
    cm_selection_free(b);
  }

  cm_selection_free(s);
  cm_selection_free(t);
}

static void test_batch_column(void) {
  static const uint64_t v[2] = {1, 2};
  const cm_column cols[3] = {
      {.field = 2, .type = CM_TYPE_U64, .width = 8, .name = "a", .data = v},
      {.field = 5, .type = CM_TYPE_U64, .width = 8, .name = "b", .data = v},
      {.field = 9, .type = CM_TYPE_U64, .width = 8, .name = "c", .data = v},
  };
  cm_batch b = {.kind = CK, .n = 2, .ncols = 3, .cols = cols};
  CMT_ASSERT(cm_batch_column(&b, 2) == &cols[0]);
  CMT_ASSERT(cm_batch_column(&b, 5) == &cols[1]);
  CMT_ASSERT(cm_batch_column(&b, 9) == &cols[2]);
  CMT_ASSERT(cm_batch_column(&b, 3) == NULL);
  CMT_ASSERT(cm_batch_column(&b, -1) == NULL);
  CMT_ASSERT(cm_batch_column(NULL, 2) == NULL);
  b.ncols = 0;
  CMT_ASSERT(cm_batch_column(&b, 2) == NULL);
}

/* The lenient mode skips each bad name, reports it with its offset, and keeps the rest. */
typedef struct skips {
  int n;
  size_t offsets[8];
  char msgs[8][512];
} skips;

static void on_skip(void *ud, size_t offset, const char *message) {
  skips *k = ud;
  if (k->n < 8) {
    k->offsets[k->n] = offset;
    snprintf(k->msgs[k->n], sizeof k->msgs[0], "%s", message);
  }
  k->n++;
}

static void test_parse_lenient(void) {
  cm_selection *s = NULL, *strict = NULL;
  CMT_OK(cm_selection_new(&s));
  CMT_OK(cm_selection_new(&strict));
  skips k;
  memset(&k, 0, sizeof k);
  const char *spec = "kernel:name,bogus_field,start;nosuchkind:all;memcpy:bytes,,stop;runtime";
  CMT_EQ(cm_selection_parse_ex(s, spec, CM_SELECT_LENIENT, on_skip, &k), 3);
  CMT_EQ(k.n, 3);
  CMT_EQ(k.offsets[0], 12);
  CMT_CONTAINS(k.msgs[0], "bogus_field");
  CMT_CONTAINS(k.msgs[0], "start"); /* the valid names are listed */
  CMT_EQ(k.offsets[1], 30);
  CMT_CONTAINS(k.msgs[1], "nosuchkind");
  CMT_CONTAINS(k.msgs[2], "empty field name");
  /* What was valid is selected, exactly as the strict parse of the valid names selects it. */
  CMT_OK(cm_selection_parse(strict, "kernel:name,start;memcpy:bytes,stop;runtime"));
  CMT_ASSERT(memcmp(s, strict, sizeof *s) == 0);
  /* A strict parse of the same text fails and changes nothing. */
  cm_selection *snap = NULL;
  CMT_OK(cm_selection_new(&snap));
  *snap = *s;
  CMT_EQ(cm_selection_parse_ex(s, spec, 0, on_skip, &k), CM_ENOFIELD);
  CMT_EQ(k.n, 3);
  CMT_UNCHANGED(s, snap);
  /* Valid text: 0 skipped; NULL callback accepted; bad flags refused. */
  CMT_EQ(cm_selection_parse_ex(s, "memset", CM_SELECT_LENIENT, NULL, NULL), 0);
  CMT_EQ(cm_selection_parse_ex(s, "x:y;;", CM_SELECT_LENIENT, NULL, NULL), 1);
  CMT_EQ(cm_selection_parse_ex(s, "memset", 0x80, NULL, NULL), CM_EINVAL);
  CMT_EQ(cm_selection_parse_ex(NULL, "memset", CM_SELECT_LENIENT, NULL, NULL), CM_EINVAL);
  cm_selection_free(s);
  cm_selection_free(strict);
  cm_selection_free(snap);
}

int main(void) {
  test_add();
  test_parse();
  test_parse_lenient();
  test_batch_column();
  printf("test_select: ok\n");
  return 0;
}
