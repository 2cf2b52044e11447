/* The OpenMP team a kernel's parallel region runs on, and each member's share of the work.
 *
 * Built with -fopenmp, a kernel library needs libgomp.so.1, which the dynamic loader matches to the copy torch
 * already loaded (the same soname): its parallel regions run on torch's own thread team (build.py checks
 * that the process maps that one OpenMP runtime alone). Built without, a region is one thread: member 0 of 1.
 */
#ifndef TXL_TEAM_H
#define TXL_TEAM_H

#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
static inline int64_t team_member(void) { return omp_get_thread_num(); }
static inline int64_t team_size(void) { return omp_get_num_threads(); }
#else
static inline int64_t team_member(void) { return 0; }
static inline int64_t team_size(void) { return 1; }
#endif

/* This member's contiguous run [*begin, *end) of `items`, the runs in member order covering them once. */
static inline void team_share(int64_t items, int64_t *begin, int64_t *end) {
    const int64_t part = team_member(), parts = team_size();
    *begin = items * part / parts;
    *end = items * (part + 1) / parts;
}

#endif
