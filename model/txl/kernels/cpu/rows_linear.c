/* A linear layer over a few input rows on the CPU, reading each weight once, front to back: decoding's case.
 *
 * y[r, o] = sum_i W[o, i] x[r, i] (+ bias[o]) for the rows r < R and outputs o in [begin, end). Decoding is bound
 * by reading the weights: this walks them as one sequential stream, the pattern the hardware prefetchers follow
 * best (a walk over four weight rows side by side was much slower), and takes every input row against a
 * weight row while that row is in L1 (taking four input rows at once per weight row was slower still). Meant for
 * one to a few rows: from about 8 the products, not the reads, bound it, and a blocked GEMM wins.
 *
 * Layouts: W [out, in] row-major, in float32 or bfloat16 (uint16 bits); x [R, in] float32; bias [out] in W's type,
 * or NULL; y [R, out] in W's type. Sums are float32; bfloat16 results are rounded to nearest even.
 *
 * The _threads entries split the outputs [0, out) over an OpenMP team in contiguous runs, each thread one
 * sequential stream of weight rows, on torch's own team (team.h). Each output is one thread's whole sum: the same
 * bits on any number of threads.
 */
#include <stdint.h>
#include <string.h>

#include "team.h"

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN stays NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#define LOAD_F32(v) (v)
#define STORE_F32(v) (v)
#define LOAD_BF16(v) bf16_to_f32(v)
#define STORE_BF16(v) f32_to_bf16(v)

#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                                 \
    void NAME(const T *restrict W, const float *restrict x, const T *restrict bias, T *restrict y,          \
              int64_t R, int64_t out, int64_t in, int64_t begin, int64_t end) {                             \
        for (int64_t o = begin; o < end; o++) {                                                             \
            const T *restrict w = W + o * in;                                                               \
            const float b = bias ? LOAD(bias[o]) : 0.0f;                                                    \
            for (int64_t r = 0; r < R; r++) {                                                               \
                const float *restrict xr = x + r * in;                                                      \
                float acc = 0.0f;                                                                           \
                _Pragma("omp simd reduction(+ : acc)") for (int64_t i = 0; i < in; i++) {                   \
                    acc += LOAD(w[i]) * xr[i];                                                              \
                }                                                                                           \
                y[r * out + o] = STORE(acc + b);                                                            \
            }                                                                                               \
        }                                                                                                   \
    }

DEFINE_KERNEL(txl_rows_linear_f32, float, LOAD_F32, STORE_F32)
DEFINE_KERNEL(txl_rows_linear_bf16, uint16_t, LOAD_BF16, STORE_BF16)

#define DEFINE_THREADED(NAME, KERNEL, T)                                                                    \
    void NAME(const T *restrict W, const float *restrict x, const T *restrict bias, T *restrict y,          \
              int64_t R, int64_t out, int64_t in, int64_t threads) {                                        \
        _Pragma("omp parallel num_threads((int)threads)") {                                                  \
            int64_t begin, end;                                                                              \
            team_share(out, &begin, &end);                                                                   \
            KERNEL(W, x, bias, y, R, out, in, begin, end);                                                   \
        }                                                                                                    \
    }

DEFINE_THREADED(txl_rows_linear_f32_threads, txl_rows_linear_f32, float)
DEFINE_THREADED(txl_rows_linear_bf16_threads, txl_rows_linear_bf16, uint16_t)
