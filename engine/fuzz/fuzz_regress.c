/*
 * fuzz_regress.c: runs a fuzz target's entry point (LLVMFuzzerTestOneInput) over files, without
 * libFuzzer, so that the committed seeds and crashers are regression tests of the normal build
 * (and of the sanitizer builds, which instrument it like everything else).
 *
 * Usage: fuzz_regress PATH... where each PATH is a file or a directory whose regular files are
 * run in name order. It exits 0 when every input ran (a broken invariant aborts, a sanitizer
 * report fails the run), 1 when a path cannot be read, and 2 when no input was found, so a
 * misplaced corpus cannot pass as an empty one.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    perror(path);
    return -1;
  }
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : 65536;
      uint8_t *p = realloc(buf, cap);
      if (!p) abort();
      buf = p;
    }
    size_t got = fread(buf + n, 1, cap - n, fp);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(fp);
  fclose(fp);
  if (bad) {
    perror(path);
    free(buf);
    return -1;
  }
  /* An exact-size copy, so a read past the input's end is a sanitizer report, as under
   * libFuzzer. */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) abort();
  if (n) memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
  long ran = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (run_file(argv[i])) return 1;
      ran++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (!d) {
      perror(argv[i]);
      return 1;
    }
    char **names = NULL;
    size_t nn = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      if (e->d_name[0] == '.') continue;
      char **p = realloc(names, (nn + 1) * sizeof *names);
      if (!p) abort();
      names = p;
      size_t len = strlen(argv[i]) + strlen(e->d_name) + 2;
      names[nn] = malloc(len);
      if (!names[nn]) abort();
      snprintf(names[nn], len, "%s/%s", argv[i], e->d_name);
      nn++;
    }
    closedir(d);
    qsort(names, nn, sizeof *names, by_name);
    for (size_t k = 0; k < nn; k++) {
      if (stat(names[k], &st) == 0 && S_ISREG(st.st_mode)) {
        if (run_file(names[k])) return 1;
        ran++;
      }
      free(names[k]);
    }
    free(names);
  }
  printf("fuzz_regress: %ld inputs ran\n", ran);
  return ran > 0 ? 0 : 2;
}
