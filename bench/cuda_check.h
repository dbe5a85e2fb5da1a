/*
 * cuda_check.h: CK(call), the CUDA runtime error check of the benchmark programs: on an error it
 * prints the file, the line, the error's name and the call, and exits with status 1.
 */
#ifndef CM_BENCH_CUDA_CHECK_H
#define CM_BENCH_CUDA_CHECK_H

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t ck_rc_ = (call);                                                              \
    if (ck_rc_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: CUDA error %s in %s\n", __FILE__, __LINE__,                   \
              cudaGetErrorName(ck_rc_), #call);                                               \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

#endif
