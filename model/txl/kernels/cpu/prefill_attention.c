/* Relative attention of a prompt segment's queries over paged memories, on the CPU (float32).
 *
 * For each (head h, row b) of a query group: query i of the row sits at table position p = start + klen - T + i
 * and sees the slots j in [max(start, p - window_i + 1), p] of its block table. Its score for slot j is
 * AC + BD = qc_i . K[j] + qp_i . R[p - j] (content and positional terms; the queries arrive biased and scaled),
 * softmax over the visible slots, and the output is the weighted sum of the values V[j].
 *
 * Three products per (h, b), each a register-tiled loop (below): AC = Qc K^T over the row's slots, BD = Qp R^T over
 * every distance, O = softmax(AC + shifted BD) V. Why not torch's: its float32 bmm is MKL's, which on some CPUs
 * runs AVX2 code well below their rate, while these loops, compiled with -march=native, run as fast as oneDNN's
 * packed products (docs/model.md has the figures). Between the products one pass per query adds the positional
 * scores of its distances, takes the softmax and zeroes the hidden slots. Keys and values are gathered from the
 * row's blocks once per (h, b), only over the slots some query sees; the products skip the tiles no query of
 * theirs sees.
 *
 * Layouts: qc, qp [N, H, Dh] with token_index [B*T] giving each (b, i)'s row; keys, values: one layer of the pool
 * [H, NB, bs, Dh]; table [B, S] int64; starts, klens [B], windows [B, T] int64; pos: head h's positional keys for
 * distances P-1..0 at pos + h * pos_head_stride, [P, Dh]; out [B*T, H, Dh]. Work items h * B + b in [begin, end);
 * scratch: txl_prefill_scratch_floats(...) floats for this call alone (any contents).
 *
 * txl_prefill_attention_f32_threads splits the items over an OpenMP team, each thread with its own scratch: torch's
 * own team (team.h), the threads that run its products, so the two never hold more threads than torch's count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "team.h"

#if defined(__AVX512F__)
#define VEC 16 /* floats per vector register */
#else
#define VEC 8
#endif
#define PANEL 64 /* columns of a key or distance tile: a multiple of every tile width below */
#define ROWS_PAD 12 /* the most rows a tile writes */

typedef float vf __attribute__((vector_size(VEC * 4)));
typedef int32_t vi __attribute__((vector_size(VEC * 4)));

static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ------------------------------------------------------------------------------------------------ products */

/* C[MR, NV*VEC] = A[MR, k0:k1] B[k0:k1, NV*VEC]: MR x NV accumulators held in registers, each B row loaded once
 * per tile and each A element broadcast once. A rows at or past `rows` repeat the last row (their results land in
 * C's padding rows), so that every tile is a whole one. */
#define DEFINE_TILE(MR, NV)                                                                                      \
    static void tile_##MR##x##NV(const float *a, int64_t lda, int64_t rows, const float *b, int64_t ldb,        \
                                 float *c, int64_t ldc, int64_t k0, int64_t k1) {                               \
        vf acc[MR][NV];                                                                                         \
        const float *row[MR];                                                                                   \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                                 \
            row[r] = a + (r < rows ? r : rows - 1) * lda;                                                       \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = (vf){0};                           \
        }                                                                                                       \
        for (int64_t k = k0; k < k1; k++) {                                                                     \
            vf bk[NV];                                                                                          \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) memcpy(&bk[v], b + k * ldb + v * VEC, sizeof(vf)); \
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                             \
                const float x = row[r][k];                                                                      \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] += x * bk[v];                    \
            }                                                                                                   \
        }                                                                                                       \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                                 \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) memcpy(c + r * ldc + v * VEC, &acc[r][v], sizeof(vf)); \
        }                                                                                                       \
    }

/* Tile shapes: as many accumulators as the registers hold beside a B row and a broadcast (32 registers with
 * AVX-512, 16 with AVX2). */
#if VEC == 16
DEFINE_TILE(6, 4)  /* 64 columns */
DEFINE_TILE(12, 2) /* 32 columns */
DEFINE_TILE(12, 1) /* 16 columns */
#define WIDE_ROWS 6
#define WIDE_TILE tile_6x4
#define WIDE_COLUMNS (4 * VEC)
#else
DEFINE_TILE(6, 2)  /* 16 columns */
DEFINE_TILE(12, 1) /* 8 columns */
#define WIDE_ROWS 6
#define WIDE_TILE tile_6x2
#define WIDE_COLUMNS (2 * VEC)
#endif

/* Which columns (or, for the values, which keys) a range of query rows needs. */
typedef struct {
    int64_t lo, hi; /* [lo, hi) */
} Span;

/* C[0:M, 0:N] = A B over the columns each row tile needs: N a multiple of PANEL; tiles of WIDE_ROWS rows.
 * need(i0, i1) gives the columns rows [i0, i1) need; the others are left as they were. */
typedef Span (*NeedFn)(const void *ctx, int64_t i0, int64_t i1);

static void product_wide(const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                         int64_t M, int64_t N, int64_t K, NeedFn need, const void *ctx) {
    for (int64_t j = 0; j < N; j += WIDE_COLUMNS) {
        for (int64_t i = 0; i < M; i += WIDE_ROWS) {
            const Span span = need(ctx, i, min64(i + WIDE_ROWS, M));
            if (span.hi <= j || span.lo >= j + WIDE_COLUMNS) continue;
            WIDE_TILE(a + i * lda, lda, M - i, b + j, ldb, c + i * ldc + j, ldc, 0, K);
        }
    }
}

typedef void (*TileFn)(const float *a, int64_t lda, int64_t rows, const float *b, int64_t ldb, float *c,
                       int64_t ldc, int64_t k0, int64_t k1);

/* A tile shape: its function, rows and columns. */
typedef struct {
    TileFn tile;
    int64_t rows, columns;
} Shape;

/* The widest tile whose columns divide N (a multiple of VEC). */
static Shape narrow_shape(int64_t N) {
#if VEC == 16
    if (N % (4 * VEC) == 0) return (Shape){tile_6x4, 6, 4 * VEC};
    if (N % (2 * VEC) == 0) return (Shape){tile_12x2, 12, 2 * VEC};
#else
    if (N % (2 * VEC) == 0) return (Shape){tile_6x2, 6, 2 * VEC};
#endif
    return (Shape){tile_12x1, 12, VEC};
}

/* C[0:M, 0:N] = A B summing only over the keys each row tile needs (the others have weight 0): N a multiple of
 * VEC, the value width. */
static void product_narrow(const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                           int64_t M, int64_t N, NeedFn need, const void *ctx) {
    const Shape shape = narrow_shape(N);
    for (int64_t j = 0; j < N; j += shape.columns)
        for (int64_t i = 0; i < M; i += shape.rows) {
            const Span s = need(ctx, i, min64(i + shape.rows, M));
            shape.tile(a + i * lda, lda, M - i, b + j, ldb, c + i * ldc + j, ldc, s.lo, s.hi);
        }
}

/* ------------------------------------------------------------------------------------------------ softmax */

/* exp(x) for x <= 0 (scores minus their maximum), within 2 ulp of expf: x = n ln2 + r with |r| <= ln2/2, a
 * degree-6 polynomial for e^r (Cephes' coefficients), times 2^n built from its exponent bits. In vector types,
 * because GCC kept the scalar form of the bit cast scalar. Below -87.3, where expf is denormal or 0, x is
 * clamped: a weight under 1e-38 beside the maximum's weight of 1 vanishes from the float32 sum either way. */
static inline vf exp_nonpositive(vf x) {
    const vf lowest = x - x - 87.3f;
    const vi low = x < lowest; /* all bits set where true (C has no vector ?:) */
    x = (vf)(((vi)lowest & low) | ((vi)x & ~low));
    /* n = round(x / ln2): adding and subtracting 1.5 * 2^23 rounds to an integer (no fast-math folds it). */
    const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    vf r = x - n * 0.693359375f; /* ln2 in two parts: n times the first is exact */
    r = r - n * -2.12194440e-4f;
    vf poly = r * 1.9875691500e-4f + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    poly = poly * r * r + r + 1.0f;
    const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return poly * (vf)bits;
}

/* x[0..n) = exp(x[0..n) - shift), a vector at a time (the last partial one through a copy); returns their sum. */
static float exp_sum(float *x, int64_t n, float shift) {
    vf sums = {0};
    int64_t j = 0;
    for (; j + VEC <= n; j += VEC) {
        vf v;
        memcpy(&v, x + j, sizeof v);
        v = exp_nonpositive(v - shift);
        memcpy(x + j, &v, sizeof v);
        sums += v;
    }
    float total = 0.0f;
    for (int m = 0; m < VEC; m++) total += sums[m];
    if (j < n) {
        vf v = {0};
        memcpy(&v, x + j, (size_t)(n - j) * sizeof *x);
        v = exp_nonpositive(v - shift);
        memcpy(x + j, &v, (size_t)(n - j) * sizeof *x);
        for (int64_t m = 0; m < n - j; m++) total += v[m];
    }
    return total;
}

/* One query's scores s (AC at the slots it sees, [first, p]) -> exp(score - max) there and 0 at the hidden slots
 * of [lo, hi) (those the value product reads); returns 1 / the sum, by which the query's output is scaled after
 * the value product (Dh multiplications instead of one per slot). shifted[j] is slot j's positional score. */
static float softmax_row(float *s, const float *shifted, int64_t first, int64_t p, int64_t lo, int64_t hi) {
    float best = -INFINITY;
#pragma omp simd reduction(max : best)
    for (int64_t j = first; j <= p; j++) {
        const float x = s[j] + shifted[j];
        s[j] = x;
        best = x > best ? x : best;
    }
    const float total = exp_sum(s + first, p + 1 - first, best);
    memset(s + lo, 0, (size_t)(first - lo) * sizeof *s);
    memset(s + p + 1, 0, (size_t)(hi - p - 1) * sizeof *s);
    return 1.0f / total;
}

/* ------------------------------------------------------------------------------------------------ transposes */

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* dst[d * ld + k] = rows[k][d] for k < n and d < width: n rows of `width` floats (each anywhere: a slot's key in
 * its block) into columns. Eight rows by eight floats at a time through registers (three rounds of shuffles), the
 * rest one by one: element by element, with a store 4 * ld bytes from the last, it had cost a large share of
 * what the three products it feeds do (docs/model.md). */
static void transpose_rows(const float *const *rows, int64_t n, int64_t width, float *dst, int64_t ld) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        int64_t d = 0;
        for (; d + 8 <= width; d += 8) {
            v8 r[8], t[8], u[8];
            for (int m = 0; m < 8; m++) memcpy(&r[m], rows[k + m] + d, sizeof(v8));
            for (int m = 0; m < 8; m += 2) {
                t[m] = __builtin_shuffle(r[m], r[m + 1], (v8i){0, 8, 1, 9, 4, 12, 5, 13});
                t[m + 1] = __builtin_shuffle(r[m], r[m + 1], (v8i){2, 10, 3, 11, 6, 14, 7, 15});
            }
            for (int m = 0; m < 8; m += 4) {
                u[m] = __builtin_shuffle(t[m], t[m + 2], (v8i){0, 1, 8, 9, 4, 5, 12, 13});
                u[m + 1] = __builtin_shuffle(t[m], t[m + 2], (v8i){2, 3, 10, 11, 6, 7, 14, 15});
                u[m + 2] = __builtin_shuffle(t[m + 1], t[m + 3], (v8i){0, 1, 8, 9, 4, 5, 12, 13});
                u[m + 3] = __builtin_shuffle(t[m + 1], t[m + 3], (v8i){2, 3, 10, 11, 6, 7, 14, 15});
            }
            for (int m = 0; m < 4; m++) { /* u[m]: columns m and m + 4 of rows 0-3; u[m + 4]: of rows 4-7 */
                const v8 low = __builtin_shuffle(u[m], u[m + 4], (v8i){0, 1, 2, 3, 8, 9, 10, 11});
                const v8 high = __builtin_shuffle(u[m], u[m + 4], (v8i){4, 5, 6, 7, 12, 13, 14, 15});
                memcpy(dst + (d + m) * ld + k, &low, sizeof(v8));
                memcpy(dst + (d + m + 4) * ld + k, &high, sizeof(v8));
            }
        }
        for (; d < width; d++)
            for (int m = 0; m < 8; m++) dst[d * ld + k + m] = rows[k + m][d];
    }
    for (; k < n; k++)
        for (int64_t d = 0; d < width; d++) dst[d * ld + k] = rows[k][d];
}

/* ------------------------------------------------------------------------------------------------ one row */

typedef struct {
    int64_t T, Dh, P, Lp, Pp, Dp; /* queries; head size; distances; padded slots, distances, head size */
} Sizes;

/* A row's queries: the first sits at p0; query i sees [first[i], p0 + i]. */
typedef struct {
    int64_t p0, P;
    const int64_t *first;
} Queries;

static Span slots_needed(const void *ctx, int64_t i0, int64_t i1) {
    const Queries *q = ctx;
    int64_t lo = q->first[i0];
    for (int64_t i = i0 + 1; i < i1; i++) lo = min64(lo, q->first[i]);
    return (Span){lo, q->p0 + i1};
}

/* Query i needs distances 0..p-first: columns P-1-(p-first) .. P-1 of its positional scores. */
static Span distances_needed(const void *ctx, int64_t i0, int64_t i1) {
    const Queries *q = ctx;
    int64_t widest = 0;
    for (int64_t i = i0; i < i1; i++) widest = max64(widest, q->p0 + i - q->first[i]);
    return (Span){q->P - 1 - widest, q->P};
}

int64_t txl_prefill_scratch_floats(int64_t T, int64_t Dh, int64_t L, int64_t P) {
    const int64_t Tp = round_up(T, ROWS_PAD), Lp = round_up(L, PANEL), Pp = round_up(P, PANEL);
    const int64_t Dp = round_up(Dh, VEC);
    /* qc, qp; K^T, R^T; V; AC/probabilities, BD, O; per query its first slot and 1 / its softmax's sum (int64 and
     * float, two floats each); a pointer per slot or distance (two floats each) */
    return 2 * T * Dh + Dh * Lp + Dh * Pp + Lp * Dp + Tp * (Lp + Pp + Dp) + 4 * T + 2 * max64(L, P);
}

void txl_prefill_attention_f32(const float *qc, const float *qp, const int64_t *token_index, const float *keys,
                               const float *values, const int64_t *table, const int64_t *starts,
                               const int64_t *klens, const int64_t *windows, const float *pos,
                               int64_t pos_head_stride, float *out, int64_t H, int64_t B, int64_t T, int64_t Dh,
                               int64_t S, int64_t NB, int64_t bs, int64_t P, int64_t begin, int64_t end,
                               float *scratch) {
    const int64_t L = S * bs;
    const Sizes z = {T, Dh, P, round_up(L, PANEL), round_up(P, PANEL), round_up(Dh, VEC)};
    const int64_t Tp = round_up(T, ROWS_PAD);
    float *q_content = scratch, *q_position = q_content + T * Dh;
    float *keys_t = q_position + T * Dh;   /* [Dh, Lp] */
    float *pos_t = keys_t + Dh * z.Lp;     /* [Dh, Pp] */
    float *vals = pos_t + Dh * z.Pp;       /* [Lp, Dp] */
    float *scores = vals + z.Lp * z.Dp;    /* [Tp, Lp] */
    float *by_distance = scores + Tp * z.Lp; /* [Tp, Pp] */
    float *o = by_distance + Tp * z.Pp;    /* [Tp, Dp] */
    int64_t *first = (int64_t *)(o + Tp * z.Dp);
    float *inverse = (float *)(first + T); /* [T] pairs of floats: 1 / each query's sum, then padding */
    const float **row_at = (const float **)(inverse + 2 * T);
    int64_t packed_head = -1;
    for (int64_t item = begin; item < end; item++) {
        const int64_t h = item / B, b = item % B;
        /* The positional keys of head h, transposed: [Dh, P] (once per head: items run head by head). */
        if (h != packed_head) {
            const float *ph = pos + h * pos_head_stride;
            for (int64_t c = 0; c < P; c++) row_at[c] = ph + c * Dh;
            transpose_rows(row_at, P, Dh, pos_t, z.Pp);
            packed_head = h;
        }
        for (int64_t i = 0; i < T; i++) {
            const int64_t token = token_index[b * T + i];
            memcpy(q_content + i * Dh, qc + (token * H + h) * Dh, (size_t)Dh * sizeof(float));
            memcpy(q_position + i * Dh, qp + (token * H + h) * Dh, (size_t)Dh * sizeof(float));
        }
        const int64_t p0 = starts[b] + klens[b] - T;
        int64_t lo = p0;
        for (int64_t i = 0; i < T; i++) {
            first[i] = max64(starts[b], p0 + i - windows[b * T + i] + 1);
            lo = min64(lo, first[i]);
        }
        const int64_t hi = p0 + T; /* slots [lo, hi) are seen by some query */
        /* The slots' keys, transposed [Dh, Lp], and values [Lp, Dp], from the row's blocks. */
        const int64_t *row_table = table + b * S;
        for (int64_t j = lo; j < hi; j++) {
            const int64_t at = ((h * NB + row_table[j / bs]) * bs + j % bs) * Dh;
            row_at[j - lo] = keys + at;
            memcpy(vals + j * z.Dp, values + at, (size_t)Dh * sizeof(float));
        }
        transpose_rows(row_at, hi - lo, Dh, keys_t + lo, z.Lp);
        const Queries queries = {p0, P, first};
        product_wide(q_content, Dh, keys_t, z.Lp, scores, z.Lp, T, z.Lp, Dh, slots_needed, &queries);
        product_wide(q_position, Dh, pos_t, z.Pp, by_distance, z.Pp, T, z.Pp, Dh, distances_needed, &queries);
        for (int64_t i = 0; i < T; i++) {
            const int64_t p = p0 + i;
            /* Slot j's positional score is column P-1-(p-j) of the query's row: shifted to line up with j. */
            float *row = scores + i * z.Lp;
            inverse[i] = softmax_row(row, by_distance + i * z.Pp + (P - 1 - p), first[i], p, lo, hi);
        }
        product_narrow(scores, z.Lp, vals, z.Dp, o, z.Dp, T, z.Dp, slots_needed, &queries);
        for (int64_t i = 0; i < T; i++) {
            float *dst = out + ((b * T + i) * H + h) * Dh;
            const float *src = o + i * z.Dp;
            for (int64_t d = 0; d < Dh; d++) dst[d] = src[d] * inverse[i];
        }
    }
}

/* The items [0, H * B) split over `threads` threads in contiguous runs (items run head by head, so a thread packs
 * each of its heads' positional keys once); thread t uses scratch + t * scratch_floats. */
void txl_prefill_attention_f32_threads(const float *qc, const float *qp, const int64_t *token_index,
                                       const float *keys, const float *values, const int64_t *table,
                                       const int64_t *starts, const int64_t *klens, const int64_t *windows,
                                       const float *pos, int64_t pos_head_stride, float *out, int64_t H, int64_t B,
                                       int64_t T, int64_t Dh, int64_t S, int64_t NB, int64_t bs, int64_t P,
                                       int64_t threads, float *scratch, int64_t scratch_floats) {
    const int64_t items = H * B;
#pragma omp parallel num_threads((int)threads)
    {
        int64_t begin, end;
        team_share(items, &begin, &end);
        txl_prefill_attention_f32(qc, qp, token_index, keys, values, table, starts, klens, windows, pos,
                                  pos_head_stride, out, H, B, T, Dh, S, NB, bs, P, begin, end,
                                  scratch + team_member() * scratch_floats);
    }
}
