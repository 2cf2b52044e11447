/* One whole decoder layer for rows that each decode one token, on the CPU, in float32: what decoding does
 * between two layers' worth of weight reads, in one call instead of about forty small torch operations.
 *
 * The same function as `RelPartialLearnableDecoderLayer.forward_paged` over a step whose rows each feed one token:
 *
 *     h    = pre_lnorm ? LN1(x) : x
 *     q, k, v = split(h W_qkv^T)                     per row [H, Dh] each
 *     pool[k, v] at (write_block, write_slot)        and x into the hidden-state pool, where one is kept
 *     attention of (q + u) s and (q + v) s over the row's blocks (see paged_decode.c), positional keys read
 *     from the layer's table per distance: score(j) = (q + u) s . K[j] + (q + v) s . R[Ptab - 1 - (p - j)]
 *     x    = pre_lnorm ? x + a W_o^T : LN1(x + a W_o^T)
 *     x    = pre_lnorm ? x + FF(LN2(x)) : LN2(x + FF(x)),  FF(z) = W_2 relu(W_1 z + b_1) + b_2
 *
 * Every linear layer walks its weight once, front to back, taking each input row against a weight row while
 * that row is in L1 (as rows_linear.c does: decoding is bound by reading the weights). x [R, D] is updated in
 * place. Scratch: at least R * (4 H Dh + D + Di) + threads * S * bs floats.
 *
 * With `threads` > 1 the layer runs in one OpenMP parallel region: each linear layer's output features, and the
 * attention's (head, row) items, are split over the team (torch's own: team.h), each stage ending at the team's
 * barrier. Every output element is computed by one thread in the order one thread would: the bits do not depend
 * on the thread count.
 *
 * `txl_decode_layers_f32` runs a step's layers one after the other in one call: the caller (Python, through ctypes)
 * gives up the GIL once for the whole step instead of once a layer, and so does not wait for it between layers
 * while another thread holds it (a server's event loop handling the last token meanwhile).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "team.h"

typedef struct {
    const float *qkv_w; /* [3 H Dh, D] */
    const float *o_w;   /* [D, H Dh] */
    const float *ff1_w; /* [Di, D] */
    const float *ff1_b; /* [Di] */
    const float *ff2_w; /* [D, Di] */
    const float *ff2_b; /* [D] */
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* [D] each: the attention's LayerNorm, then the FF's */
    const float *u, *v;                         /* [H, Dh]: r_w_bias, r_r_bias */
    float eps1, eps2, scale;
    int64_t pre_lnorm;
} TxlLayer;

/* What a layer reads and writes besides its weights, which may move between steps. */
typedef struct {
    const float *pos; /* [H, Ptab, Dh]: positional keys for distances Ptab-1..0 */
    int64_t ptab;
    float *keys, *values; /* this layer's pool [H, NB, bs, Dh] */
    float *hidden;        /* this layer's hidden-state pool [NB, bs, D], or NULL */
} TxlState;

typedef struct {
    int64_t R, D, H, Dh, Di, S, NB, bs;
    const int64_t *table;        /* [R, S] block ids */
    const int64_t *starts;       /* [R] offset of the row's first position in its first block */
    const int64_t *klens;        /* [R] positions the row's query sees (memory + 1) */
    const int64_t *windows;      /* [R] the query sees keys at distance < window */
    const int64_t *write_blocks; /* [R] where the new position's keys and values go */
    const int64_t *write_slots;  /* [R] */
} TxlRows;

/* a . b over n floats, in four independent vector sums of 8 lanes (one running sum is a chain of dependent
 * multiply-adds: the core then waits on each add's latency once the weights come from cache). */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 += *(const v8 *)(a + i) * *(const v8 *)(b + i);
        s1 += *(const v8 *)(a + i + 8) * *(const v8 *)(b + i + 8);
        s2 += *(const v8 *)(a + i + 16) * *(const v8 *)(b + i + 16);
        s3 += *(const v8 *)(a + i + 24) * *(const v8 *)(b + i + 24);
    }
    const v8 s = (s0 + s1) + (s2 + s3);
    float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* What a linear layer does with its result s = W[o] . x[r] + b[o]: store it, add it to y (a residual), or store
 * relu(s). */
typedef enum { STORE, ADD_TO, RELU } Epilogue;

/* y[r, o] <- epilogue(W[o] . x[r] (+ b[o])) for r < R, o < out. Output features split over the team (each thread
 * one contiguous run of weight rows), then the team's barrier. */
static void linear_rows(const float *restrict W, const float *restrict x, const float *restrict b,
                        float *restrict y, int64_t R, int64_t out, int64_t in, Epilogue epilogue) {
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; o++) {
        const float *restrict w = W + o * in;
        const float bias = b ? b[o] : 0.0f;
        for (int64_t r = 0; r < R; r++) {
            const float s = dot(w, x + r * in, in) + bias;
            float *dst = y + r * out + o;
            *dst = epilogue == ADD_TO ? *dst + s : epilogue == RELU ? (s > 0.0f ? s : 0.0f) : s;
        }
    }
}

/* Each row of y [R, D] <- LayerNorm(y) (biased variance, as torch's). */
static void layer_norm_rows(float *restrict y, const float *restrict w, const float *restrict b, float eps,
                            int64_t R, int64_t D) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; r++) {
        float *restrict row = y + r * D;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < D; i++) sum += row[i];
        const float mean = sum / (float)D;
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < D; i++) squares += (row[i] - mean) * (row[i] - mean);
        const float inv = 1.0f / sqrtf(squares / (float)D + eps);
#pragma omp simd
        for (int64_t i = 0; i < D; i++) row[i] = (row[i] - mean) * inv * w[i] + b[i];
    }
}

/* One head of one row: out [Dh] <- attention of the query q [Dh] over table positions first..p of the row's
 * blocks (kh, vh: this head's part of the pool; ph: its positional keys). Inlined with Dh a constant where the
 * caller knows it (32, 64), so that the query, the positional query and the output stay in registers, and each
 * key's two products share one horizontal sum. */
static inline __attribute__((always_inline)) void attend_head(
    const TxlLayer *L, const TxlState *M, const float *restrict q, const float *restrict u, const float *restrict v,
    const float *restrict kh, const float *restrict vh, const float *restrict ph, const int64_t *table,
    int64_t first, int64_t p, int64_t bs, const int64_t Dh, float *restrict scores, float *restrict out) {
    float qc[Dh], qp[Dh], acc[Dh];
    for (int64_t d = 0; d < Dh; d++) {
        qc[d] = (q[d] + u[d]) * L->scale;
        qp[d] = (q[d] + v[d]) * L->scale;
        acc[d] = 0.0f;
    }
    float best = -INFINITY;
    for (int64_t blk = first / bs; blk <= p / bs; blk++) {
        const int64_t lo = blk * bs > first ? blk * bs : first, hi = blk * bs + bs - 1 < p ? blk * bs + bs - 1 : p;
        const float *kb = kh + table[blk] * bs * Dh;
        for (int64_t j = lo; j <= hi; j++) {
            const float *k = kb + (j - blk * bs) * Dh, *r = ph + (M->ptab - 1 - (p - j)) * Dh;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < Dh; d++) s += qc[d] * k[d] + qp[d] * r[d];
            scores[j - first] = s;
            best = s > best ? s : best;
        }
    }
    float total = 0.0f;
    for (int64_t j = first; j <= p; j++) {
        const float e = expf(scores[j - first] - best);
        scores[j - first] = e;
        total += e;
    }
    for (int64_t blk = first / bs; blk <= p / bs; blk++) {
        const int64_t lo = blk * bs > first ? blk * bs : first, hi = blk * bs + bs - 1 < p ? blk * bs + bs - 1 : p;
        const float *vb = vh + table[blk] * bs * Dh;
        for (int64_t j = lo; j <= hi; j++) {
            const float w = scores[j - first], *val = vb + (j - blk * bs) * Dh;
#pragma omp simd
            for (int64_t d = 0; d < Dh; d++) acc[d] += w * val[d];
        }
    }
    const float inv = 1.0f / total;
    for (int64_t d = 0; d < Dh; d++) out[d] = acc[d] * inv;
}

/* attn [R, H Dh] <- each row's attention over its blocks; qkv [R, 3, H, Dh]. Heads outside, rows inside: a head's
 * positional keys (Ptab Dh floats) are read by every row, and stay in cache from one row to the next. The
 * (head, row) items split over the team in contiguous runs; each thread has its own S * bs scores. */
static void attend(const TxlLayer *L, const TxlState *M, const TxlRows *rows, const float *qkv, float *attn,
                   float *scores) {
    const int64_t H = rows->H, Dh = rows->Dh, S = rows->S, NB = rows->NB, bs = rows->bs;
    const int64_t inner = H * Dh;
    float *own_scores = scores + team_member() * S * bs;
#pragma omp for collapse(2) schedule(static)
    for (int64_t h = 0; h < H; h++) {
        for (int64_t r = 0; r < rows->R; r++) {
            const float *u = L->u + h * Dh, *v = L->v + h * Dh;
            const float *kh = M->keys + h * NB * bs * Dh, *vh = M->values + h * NB * bs * Dh;
            const float *ph = M->pos + h * M->ptab * Dh; /* distance d: row Ptab - 1 - d */
            const int64_t p = rows->starts[r] + rows->klens[r] - 1; /* the query's position in its table */
            int64_t first = p - rows->windows[r] + 1;
            if (first < rows->starts[r]) first = rows->starts[r];
            const int64_t *table = rows->table + r * S;
            const float *q = qkv + r * 3 * inner + h * Dh;
            float *out = attn + r * inner + h * Dh;
            if (Dh == 32)
                attend_head(L, M, q, u, v, kh, vh, ph, table, first, p, bs, 32, own_scores, out);
            else if (Dh == 64)
                attend_head(L, M, q, u, v, kh, vh, ph, table, first, p, bs, 64, own_scores, out);
            else
                attend_head(L, M, q, u, v, kh, vh, ph, table, first, p, bs, Dh, own_scores, out);
        }
    }
}

/* Each row's new keys and values (and its input, where the pool keeps hidden states) into its write slot. */
static void write_pool(const TxlState *M, const TxlRows *rows, const float *qkv, const float *x) {
    const int64_t H = rows->H, Dh = rows->Dh, D = rows->D, bs = rows->bs, inner = H * Dh;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows->R; r++) {
        const int64_t at = rows->write_blocks[r] * bs + rows->write_slots[r];
        for (int64_t hd = 0; hd < H; hd++) {
            const int64_t slot = (hd * rows->NB * bs + at) * Dh;
            memcpy(M->keys + slot, qkv + r * 3 * inner + inner + hd * Dh, (size_t)Dh * sizeof *x);
            memcpy(M->values + slot, qkv + r * 3 * inner + 2 * inner + hd * Dh, (size_t)Dh * sizeof *x);
        }
        if (M->hidden) memcpy(M->hidden + at * D, x + r * D, (size_t)D * sizeof *x);
    }
}

/* normed <- LayerNorm(x), row by row (pre_lnorm's inputs to a sublayer). */
static void normed_copy(float *restrict normed, const float *restrict x, const float *w, const float *b, float eps,
                        int64_t R, int64_t D) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; r++) memcpy(normed + r * D, x + r * D, (size_t)D * sizeof *x);
    layer_norm_rows(normed, w, b, eps, R, D);
}

void txl_decode_layer_f32(const TxlLayer *L, const TxlState *M, const TxlRows *rows, float *x, float *scratch,
                          int64_t threads) {
    const int64_t R = rows->R, D = rows->D, H = rows->H, Dh = rows->Dh, Di = rows->Di;
    const int64_t inner = H * Dh;
    float *qkv = scratch;              /* [R, 3, H, Dh] */
    float *attn = qkv + R * 3 * inner; /* [R, H Dh] */
    float *normed = attn + R * inner;  /* [R, D] */
    float *mid = normed + R * D;       /* [R, Di] */
    float *scores = mid + R * Di;      /* [threads, S bs] */

    /* Every thread runs every stage below (the conditions are the same for all): each stage's loop is split
     * over the team and ends at its barrier, so a stage reads only what the ones before it finished. */
#pragma omp parallel num_threads((int)threads)
    {
        const float *h = x;
        if (L->pre_lnorm) {
            normed_copy(normed, x, L->ln1_w, L->ln1_b, L->eps1, R, D);
            h = normed;
        }
        linear_rows(L->qkv_w, h, NULL, qkv, R, 3 * inner, D, STORE);
        write_pool(M, rows, qkv, x);
        attend(L, M, rows, qkv, attn, scores);

        linear_rows(L->o_w, attn, NULL, x, R, D, inner, ADD_TO); /* x + a W_o^T */
        if (!L->pre_lnorm) layer_norm_rows(x, L->ln1_w, L->ln1_b, L->eps1, R, D);

        const float *z = x;
        if (L->pre_lnorm) {
            normed_copy(normed, x, L->ln2_w, L->ln2_b, L->eps2, R, D);
            z = normed;
        }
        linear_rows(L->ff1_w, z, L->ff1_b, mid, R, Di, D, RELU);
        linear_rows(L->ff2_w, mid, L->ff2_b, x, R, D, Di, ADD_TO); /* x + FF(z) */
        if (!L->pre_lnorm) layer_norm_rows(x, L->ln2_w, L->ln2_b, L->eps2, R, D);
    }
}

/* Layers L[0..n) in order over the same rows, each with its state M[i]: the step's layers in one call. */
void txl_decode_layers_f32(const TxlLayer *L, const TxlState *M, int64_t n, const TxlRows *rows, float *x,
                           float *scratch, int64_t threads) {
    for (int64_t i = 0; i < n; i++) txl_decode_layer_f32(L + i, M + i, rows, x, scratch, threads);
}
