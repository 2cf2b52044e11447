/* Paged relative attention for one query per row (decoding), on the CPU.
 *
 * For each (row b, head h): the query sits at table position p = start + klen - 1 and sees the keys at positions
 * j in [max(start, p - window + 1), p] of its block table. Score(j) = q . K[j] + bd[h, b, P - 1 - (p - j)] (the
 * positional term, computed by the caller for every distance); softmax over j; out = sum_j prob(j) V[j].
 * Keys and values are read once, in place, block by block: no gathered copy of the memory.
 *
 * Layouts: q [B, H, Dh] float32; bd [H, B, P] float32; keys, values: one layer of the pool [H, NB, bs, Dh] in
 * float32 or bfloat16 (uint16 bits); table [B, S] int64; starts, klens, windows [B] int64; out [B, H, Dh] float32;
 * scratch: at least S * bs floats for this call. Work items are b * H + h in [begin, end), so that callers may
 * split them across threads.
 *
 * The _threads entries split the items [0, B * H) over an OpenMP team, thread t with scratch + t * scratch_floats:
 * torch's own team (team.h), not a second set of threads fighting it for the cores (Python threads, before, were).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "team.h"

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The table positions of block blk that a query at p sees from `first` on: [*lo, *hi]. */
static inline void block_span(int64_t blk, int64_t first, int64_t p, int64_t bs, int64_t *lo, int64_t *hi) {
    *lo = blk * bs > first ? blk * bs : first;
    *hi = blk * bs + bs - 1 < p ? blk * bs + bs - 1 : p;
}

#define DEFINE_KERNEL(NAME, T, LOAD)                                                                        \
    void NAME(const float *q, const float *bd, const T *keys, const T *values, const int64_t *table,         \
              const int64_t *starts, const int64_t *klens, const int64_t *windows, float *out, int64_t B,     \
              int64_t H, int64_t S, int64_t NB, int64_t bs, int64_t Dh, int64_t P, int64_t begin,            \
              int64_t end, float *scratch) {                                                                 \
        for (int64_t item = begin; item < end; item++) {                                                     \
            const int64_t b = item / H, h = item % H;                                                        \
            const float *qv = q + (b * H + h) * Dh;                                                          \
            const float *bdv = bd + (h * B + b) * P;                                                         \
            float *o = out + (b * H + h) * Dh;                                                               \
            const int64_t p = starts[b] + klens[b] - 1;                                                      \
            int64_t first = p - windows[b] + 1;                                                              \
            if (first < starts[b]) first = starts[b];                                                        \
            const T *kh = keys + h * NB * bs * Dh;                                                           \
            const T *vh = values + h * NB * bs * Dh;                                                         \
            /* Table positions first..p, block by block: the block's base address once per block (a division \
             * per key cost more than the dot product), then its slots in order. */                           \
            const int64_t first_block = first / bs, last_block = p / bs;                                     \
            float best = -INFINITY;                                                                          \
            for (int64_t blk = first_block; blk <= last_block; blk++) {                                      \
                int64_t lo, hi;                                                                              \
                block_span(blk, first, p, bs, &lo, &hi);                                                     \
                const T *kb = kh + table[b * S + blk] * bs * Dh;                                             \
                for (int64_t j = lo; j <= hi; j++) {                                                         \
                    const T *k = kb + (j - blk * bs) * Dh;                                                   \
                    float acc = 0.0f;                                                                        \
                    _Pragma("omp simd reduction(+ : acc)") for (int64_t d = 0; d < Dh; d++) acc +=           \
                        qv[d] * LOAD(k[d]);                                                                  \
                    acc += bdv[P - 1 - p + j];                                                               \
                    scratch[j - first] = acc;                                                                \
                    if (acc > best) best = acc;                                                              \
                }                                                                                            \
            }                                                                                                \
            float total = 0.0f;                                                                              \
            for (int64_t j = first; j <= p; j++) {                                                           \
                const float w = expf(scratch[j - first] - best);                                             \
                scratch[j - first] = w;                                                                      \
                total += w;                                                                                  \
            }                                                                                                \
            const float inv = 1.0f / total;                                                                  \
            for (int64_t d = 0; d < Dh; d++) o[d] = 0.0f;                                                    \
            for (int64_t blk = first_block; blk <= last_block; blk++) {                                      \
                int64_t lo, hi;                                                                              \
                block_span(blk, first, p, bs, &lo, &hi);                                                     \
                const T *vb = vh + table[b * S + blk] * bs * Dh;                                             \
                for (int64_t j = lo; j <= hi; j++) {                                                         \
                    const T *v = vb + (j - blk * bs) * Dh;                                                   \
                    const float w = scratch[j - first] * inv;                                                \
                    _Pragma("omp simd") for (int64_t d = 0; d < Dh; d++) o[d] += w * LOAD(v[d]);             \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }

#define LOAD_F32(x) (x)
#define LOAD_BF16(x) bf16_to_f32(x)

DEFINE_KERNEL(txl_paged_decode_f32, float, LOAD_F32)
DEFINE_KERNEL(txl_paged_decode_bf16, uint16_t, LOAD_BF16)

#define DEFINE_THREADED(NAME, KERNEL, T)                                                                    \
    void NAME(const float *q, const float *bd, const T *keys, const T *values, const int64_t *table,         \
              const int64_t *starts, const int64_t *klens, const int64_t *windows, float *out, int64_t B,     \
              int64_t H, int64_t S, int64_t NB, int64_t bs, int64_t Dh, int64_t P, int64_t threads,          \
              float *scratch, int64_t scratch_floats) {                                                      \
        const int64_t items = B * H;                                                                         \
        _Pragma("omp parallel num_threads((int)threads)") {                                                  \
            int64_t begin, end;                                                                              \
            team_share(items, &begin, &end);                                                                 \
            KERNEL(q, bd, keys, values, table, starts, klens, windows, out, B, H, S, NB, bs, Dh, P, begin,   \
                   end, scratch + team_member() * scratch_floats);                                           \
        }                                                                                                    \
    }

DEFINE_THREADED(txl_paged_decode_f32_threads, txl_paged_decode_f32, float)
DEFINE_THREADED(txl_paged_decode_bf16_threads, txl_paged_decode_bf16, uint16_t)
