/* The core's clock for the x86 timing tools (x86_pipes.c, mxfp4_cycles.cpp):
   a chain of dependent adds, one a cycle, so cycles follow from seconds at
   whatever clock the core runs (the TSC ticks at the nominal rate, not the
   core's). C and C++. */
#ifndef GOOSEDUMP_CORE_CLOCK_H
#define GOOSEDUMP_CORE_CLOCK_H
#include <time.h>

static inline double now_seconds(void) {
  struct timespec a;
  clock_gettime(CLOCK_MONOTONIC, &a);
  return a.tv_sec + a.tv_nsec * 1e-9;
}

/* cycles per second: four dependent adds a loop */
static inline double core_hz(void) {
  const long n = 300000000;
  unsigned long x = 0;
  const double t = now_seconds();
  for (long i = 0; i < n; ++i) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  return 4.0 * n / (now_seconds() - t);
}
#endif
