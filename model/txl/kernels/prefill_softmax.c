/* Relative-attention probabilities of a prompt segment's queries, in place, on the CPU (float32).
 *
 * The caller has the content scores AC = q . K[j] of every (head h, row b, query i, key slot j) from one product,
 * and the positional scores of every distance from another (bd: columns for distances P-1..0). Query i of row b
 * sits at table position p = start + klen - T + i and sees the slots j in [max(start, p - window + 1), p]. This
 * pass adds each visible slot's positional score (column P-1-(p-j): the paper's relative shift, read in place),
 * takes the softmax over the visible slots and writes 0 to the hidden ones. It replaces four passes of the torch
 * path over the largest tensor of a segment: copying the shifted positional scores, adding them, masking and the
 * softmax.
 *
 * Layouts: score [H, B, T, L] float32 (in: AC; out: probabilities); bd [H, B*T, P] float32; starts, klens [B] and
 * windows [B, T] int64. Work items are the rows (h * B + b) * T + i in [begin, end), so that callers may split
 * them across threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* GCC's vector extensions: 16 floats, split into halves or quarters where the machine's registers are narrower. */
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

/* exp(x) for x <= 0 (scores minus their maximum), within 2 ulp of expf: x = n ln2 + r with |r| <= ln2/2, a
 * degree-6 polynomial for e^r (Cephes' coefficients), times 2^n built from its exponent bits. In vector types,
 * because GCC kept the scalar form of the bit cast scalar. Below -87.3, where expf is denormal or 0, x is
 * clamped: a weight under 1e-38 beside the maximum's weight of 1 vanishes from the float32 sum either way. */
static inline f32x16 exp_nonpositive(f32x16 x) {
    const f32x16 lowest = x - x - 87.3f;
    const i32x16 low = x < lowest; /* all bits set where true (C has no vector ?:) */
    x = (f32x16)(((i32x16)lowest & low) | ((i32x16)x & ~low));
    /* n = round(x / ln2): adding and subtracting 1.5 * 2^23 rounds to an integer (no fast-math folds it). */
    const f32x16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    f32x16 r = x - n * 0.693359375f; /* ln2 in two parts: n times the first is exact */
    r = r - n * -2.12194440e-4f;
    f32x16 poly = r * 1.9875691500e-4f + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    poly = poly * r * r + r + 1.0f;
    const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
    return poly * (f32x16)bits;
}

/* x[0..n) = exp(x[0..n) - shift), 16 at a time; the last partial vector goes through a copy. */
static void exp_shifted(float *x, int64_t n, float shift) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        f32x16 v;
        memcpy(&v, x + j, sizeof v);
        v = exp_nonpositive(v - shift);
        memcpy(x + j, &v, sizeof v);
    }
    if (j < n) {
        f32x16 v = {0};
        memcpy(&v, x + j, (size_t)(n - j) * sizeof *x);
        v = exp_nonpositive(v - shift);
        memcpy(x + j, &v, (size_t)(n - j) * sizeof *x);
    }
}

void txl_prefill_softmax_f32(float *score, const float *bd, const int64_t *starts, const int64_t *klens,
                             const int64_t *windows, int64_t B, int64_t T, int64_t L, int64_t P, int64_t begin,
                             int64_t end) {
    for (int64_t item = begin; item < end; item++) {
        const int64_t i = item % T, b = (item / T) % B, h = item / (T * B);
        float *s = score + item * L;
        /* bd's row of this query: [H, B*T, P] at (h, b*T + i), i.e. row item as well. */
        const float *bdv = bd + (h * B * T + b * T + i) * P;
        const int64_t p = starts[b] + klens[b] - T + i;
        int64_t first = p - windows[b * T + i] + 1;
        if (first < starts[b]) first = starts[b];
        /* Slot j's positional score is bdv[P - 1 - p + j]: shift the row so that it lines up with s. */
        const float *shifted = bdv + (P - 1 - p);
        float best = -INFINITY;
#pragma omp simd reduction(max : best)
        for (int64_t j = first; j <= p; j++) {
            const float x = s[j] + shifted[j];
            s[j] = x;
            best = x > best ? x : best;
        }
        exp_shifted(s + first, p + 1 - first, best);
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = first; j <= p; j++) total += s[j];
        const float inverse = 1.0f / total;
#pragma omp simd
        for (int64_t j = first; j <= p; j++) s[j] *= inverse;
        memset(s, 0, (size_t)first * sizeof *s);
        memset(s + p + 1, 0, (size_t)(L - p - 1) * sizeof *s);
    }
}
