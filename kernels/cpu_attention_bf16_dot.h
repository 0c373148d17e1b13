/* Paged attention of a bf16 cache on a CPU with AVX512-BF16: the part of
 * kernels/cpu_paged_attention.c that `vdpbf16ps` does, included there when the kernel is built
 * with -mavx512bf16 (kernels/cpu_paged_attention.py asks for it where the CPU has the
 * instructions and torch runs at AVX-512).
 *
 * From DOT_MIN_ROWS rows a (sequence, KV head) (speculative verification, short chunks), the
 * query rows sit in the 16 lanes of a zmm, 16 rows at a time, and everything per row happens
 * lane-wise:
 *   1. scores: one `vdpbf16ps` takes one bf16 pair (two dimensions) of the 16 query rows
 *      against that pair of one key, broadcast from the cache; a score is a plain sum over the
 *      pairs in its row's lane (no sum across lanes, no widening of keys). Scores are kept key
 *      by key, [key][16 rows], one store per key.
 *   2. softmax over keys, 16 rows at once (exact: max-subtracted, the exp and its sum in
 *      float32); the weights are then rounded to bf16, as GPU kernels round P before P V.
 *   3. P V: each `vdpbf16ps` adds two keys' terms for 16 dimensions of one row, against the
 *      value rows of both keys interleaved once per (sequence, KV head).
 * A decode's few rows would leave most lanes empty: they are scored by row (32 dimensions of
 * one key a `vdpbf16ps`, the 16 partial sums then added across lanes), normalized by
 * kernels/cpu_paged_attention.c's softmax_rows, and weighed as in 3, each pair of value rows
 * interleaved in registers as it is read from the cache (no copy: one group of rows uses it).
 * Either way a row's result depends only on its own query and context, never on which rows
 * share the call; it does depend on how many rows its (sequence, KV head) has (the two ways
 * add in different orders), as bf16 linears already depend on the batch.
 * Needs head_dim a multiple of 64 and at most DOT_MAX_HEAD_DIM.
 */
#ifndef PAGEDSERVE_CPU_ATTENTION_BF16_DOT_H
#define PAGEDSERVE_CPU_ATTENTION_BF16_DOT_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_attention_lookahead.h"
#include "cpu_exp.h"

#define DOT_LANES 16          /* query rows per zmm */
#define DOT_MIN_ROWS 8        /* fewer rows: scored and normalized by row (see attend_pair) */
#define DOT_KEYS 8            /* keys scored together */
#define DOT_ROW_GROUP 6       /* rows weighed together: 6 x 4 accumulators of 16 dimensions */
#define DOT_MAX_HEAD_DIM 256  /* the queries' pairs, held as zmm on the stack */
#define DOT_PREFETCH_ROWS 32  /* tokens ahead whose rows a pass over the keys or values fetches */

_Static_assert(DOT_ROW_GROUP == 6, "dot_weigh's switch covers groups of 1 to 6 rows");

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline int dot_supports(int64_t d) { return d % 64 == 0 && d <= DOT_MAX_HEAD_DIM; }

DEFINE_EXP_NONPOSITIVE(exp16_nonpositive, v16f, v16i) /* cpu_exp.h, 16 lanes */

/* Value rows t and t + 1 of one KV head interleaved for `vdpbf16ps`: for each 32-dimension
 * block c0, out gets unpacklo then unpackhi of the two rows, lane l of which pairs dimension
 * c0 + 8 * (l / 4) + l % 4 (+ 4 in unpackhi) of both. `next` NULL: row t + 1 is past the
 * context (zeros; its slot is never read, it may hold anything). */
static inline void interleave_values(__m512i *out, const uint16_t *row, const uint16_t *next,
                                     int64_t d) {
    for (int64_t c = 0; c < d; c += 32) {
        const __m512i a = _mm512_loadu_si512(row + c);
        const __m512i b = next != NULL ? _mm512_loadu_si512(next + c) : _mm512_setzero_si512();
        _mm512_storeu_si512(out++, _mm512_unpacklo_epi16(a, b));
        _mm512_storeu_si512(out++, _mm512_unpackhi_epi16(a, b));
    }
}

/* Prefetch the key and value rows at `offset` (d elements each). */
static inline void prefetch_token(const void *k_cache, const void *v_cache, int64_t offset,
                                  int64_t d) {
    for (int64_t b = 0; b < 2 * d; b += 64) {
        __builtin_prefetch((const char *)k_cache + 2 * offset + b);
        __builtin_prefetch((const char *)v_cache + 2 * offset + b);
    }
}

/* Prefetch rows from, from + 1, ... (n of them, those before seq_len) of one cache (d bf16
 * elements each). */
static inline void prefetch_rows(const uint16_t *cache, const int64_t *offsets, int64_t from,
                                 int64_t n, int64_t seq_len, int64_t d) {
    for (int64_t a = from; a < from + n && a < seq_len; a++)
        for (int64_t b = 0; b < 2 * d; b += 64)
            __builtin_prefetch((const char *)(cache + offsets[a]) + b);
}

/* All pairs of value rows of one (sequence, KV head): (seq_len + 1) / 2 * d / 16 zmm. The
 * cache's rows are scattered over blocks, so the loop fetches DOT_PREFETCH_ROWS tokens ahead,
 * keys too, which the scores read next (both fit in L2). */
static void interleave_all_values(__m512i *interleaved, const void *k_cache, const void *v_cache,
                                  const int64_t *offsets, int64_t seq_len, int64_t d,
                                  lookahead *ahead) {
    const uint16_t *values = (const uint16_t *)v_cache;
    for (int64_t a = 0; a < DOT_PREFETCH_ROWS && a < seq_len; a++)
        prefetch_token(k_cache, v_cache, offsets[a], d);
    for (int64_t t = 0; t < seq_len; t += 2) {
        if (t % 8 == 0) lookahead_step(ahead);
        for (int64_t a = t + DOT_PREFETCH_ROWS; a < t + DOT_PREFETCH_ROWS + 2 && a < seq_len; a++)
            prefetch_token(k_cache, v_cache, offsets[a], d);
        interleave_values(interleaved + t / 2 * (d / 16), values + offsets[t],
                          t + 1 < seq_len ? values + offsets[t + 1] : NULL, d);
    }
}

/* scores[t * 16 + i] = scale * <query row i, key t>, rows i < n (lanes past n: 0). next_head:
 * elements from this KV head's rows to those of the head this thread takes next (0: none),
 * whose keys and values the loop fetches as it goes, so they arrive while this head computes
 * (interleave_all_values fetched this head's already). Each tile of keys also takes a step
 * of `ahead` (the thread's next sequence; NULL: none). */
static void dot_scores(float *scores, const uint16_t *const *query_rows, int64_t n,
                       const void *k_cache, const void *v_cache, const int64_t *offsets,
                       int64_t seq_len, int64_t d, float scale, int64_t next_head,
                       lookahead *ahead) {
    const int64_t pairs = d / 2;
    const uint16_t *keys = (const uint16_t *)k_cache;
    __m512i qt[DOT_MAX_HEAD_DIM / 2]; /* qt[p] lane i: row i's pair p */
    for (int64_t p = 0; p < pairs; p++) {
        uint32_t lanes[DOT_LANES] = {0};
        for (int64_t i = 0; i < n; i++) memcpy(&lanes[i], query_rows[i] + 2 * p, 4);
        qt[p] = _mm512_loadu_si512(lanes);
    }
    const __m512 scale16 = _mm512_set1_ps(scale);
    for (int64_t t = 0; t < seq_len; t += DOT_KEYS) {
        const int64_t num_keys = seq_len - t < DOT_KEYS ? seq_len - t : DOT_KEYS;
        lookahead_step(ahead);
        if (next_head)
            for (int64_t k = 0; k < num_keys; k++)
                prefetch_token(k_cache, v_cache, offsets[t + k] + next_head, d);
        const uint16_t *key[DOT_KEYS];
        for (int64_t k = 0; k < DOT_KEYS; k++) key[k] = keys + offsets[t + (k < num_keys ? k : 0)];
        /* two sums per key (even and odd pairs): 2 * DOT_KEYS independent chains keep
         * vdpbf16ps busy through its latency */
        __m512 even[DOT_KEYS], odd[DOT_KEYS];
        for (int k = 0; k < DOT_KEYS; k++) even[k] = odd[k] = _mm512_setzero_ps();
        for (int64_t p = 0; p < pairs; p += 2) {
            const __m512bh q0 = (__m512bh)qt[p], q1 = (__m512bh)qt[p + 1];
            for (int k = 0; k < DOT_KEYS; k++) {
                int32_t pair0, pair1;
                memcpy(&pair0, key[k] + 2 * p, 4);
                memcpy(&pair1, key[k] + 2 * p + 2, 4);
                even[k] = _mm512_dpbf16_ps(even[k], q0, (__m512bh)_mm512_set1_epi32(pair0));
                odd[k] = _mm512_dpbf16_ps(odd[k], q1, (__m512bh)_mm512_set1_epi32(pair1));
            }
        }
        for (int64_t k = 0; k < num_keys; k++)
            _mm512_storeu_ps(scores + (t + k) * DOT_LANES,
                             _mm512_mul_ps(_mm512_add_ps(even[k], odd[k]), scale16));
    }
}

/* Lane i of the result: the sum of the 16 lanes of a[i]. */
static inline __m256 sum_lanes16x8(const __m512 a[8]) {
    __m512 b[4], c[2];
    for (int i = 0; i < 4; i++) /* per 128 bits: [x0+x2, y0+y2, x1+x3, y1+y3] */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int j = 0; j < 2; j++) { /* per 128 bits: one partial sum of each of 4 keys */
        const __m512d u = _mm512_castps_pd(b[2 * j]), v = _mm512_castps_pd(b[2 * j + 1]);
        c[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(u, v)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(u, v)));
    }
    const __m512 e = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 g = _mm512_shuffle_f32x4(e, e, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_add_ps(_mm512_castps512_ps256(g), _mm512_extractf32x8_ps(g, 1));
}

/* scores[r * stride + t] = scale * <query row r, key t> for a decode's few rows, by row: 32
 * dimensions of one key a `vdpbf16ps`, 8 keys at a time, each key's 16 partial sums added
 * across lanes. Scores past seq_len up to the 8-key tile are written too (softmax_rows hides
 * them). next_head and ahead as in dot_scores. */
static void dot_scores_by_row(float *scores, int64_t stride, const uint16_t *const *query_rows,
                              int64_t rows, const void *k_cache, const void *v_cache,
                              const int64_t *offsets, int64_t seq_len, int64_t d, float scale,
                              int64_t next_head, lookahead *ahead) {
    const uint16_t *keys = (const uint16_t *)k_cache;
    const __m256 scale8 = _mm256_set1_ps(scale);
    for (int64_t t = 0; t < seq_len; t += 8) {
        lookahead_step(ahead);
        if (next_head)
            for (int64_t a = t; a < t + 8 && a < seq_len; a++)
                prefetch_token(k_cache, v_cache, offsets[a] + next_head, d);
        prefetch_rows(keys, offsets, t + DOT_PREFETCH_ROWS, 8, seq_len, d);
        const uint16_t *key[8];
        for (int64_t k = 0; k < 8; k++) key[k] = keys + offsets[t + k < seq_len ? t + k : t];
        for (int64_t r = 0; r < rows; r++) {
            __m512 acc[8];
            for (int k = 0; k < 8; k++) acc[k] = _mm512_setzero_ps();
            for (int64_t c = 0; c < d; c += 32) {
                const __m512bh q = (__m512bh)_mm512_loadu_si512(query_rows[r] + c);
                for (int k = 0; k < 8; k++)
                    acc[k] = _mm512_dpbf16_ps(acc[k], q, (__m512bh)_mm512_loadu_si512(key[k] + c));
            }
            _mm256_storeu_ps(scores + r * stride + t, _mm256_mul_ps(sum_lanes16x8(acc), scale8));
        }
    }
}

/* Scores -> bf16 softmax weights, in place: pair k of row i (keys 2k and 2k + 1; 0 past the
 * row's visible keys) becomes the 32-bit word k * 16 + i. Row i sees keys t <= last[i]. 1 / the
 * sum of each row's float32 weights goes to inv_sum. */
static void dot_softmax(float *scores, const int64_t *last, int64_t n, int64_t seq_len,
                        float *inv_sum) {
    __mmask16 live = 0;
    int64_t first_hidden = seq_len; /* no row hides a key before this one */
    for (int64_t i = 0; i < n; i++) {
        live |= (__mmask16)(1u << i);
        first_hidden = last[i] + 1 < first_hidden ? last[i] + 1 : first_hidden;
    }
    for (int64_t t = first_hidden; t < seq_len; t++) {
        __mmask16 hidden = 0;
        for (int64_t i = 0; i < n; i++) hidden |= (__mmask16)((t > last[i]) << i);
        float *s = scores + t * DOT_LANES;
        _mm512_storeu_ps(s, _mm512_mask_mov_ps(_mm512_loadu_ps(s), hidden,
                                               _mm512_set1_ps(-INFINITY)));
    }
    __m512 max = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < seq_len; t++)
        max = _mm512_max_ps(max, _mm512_loadu_ps(scores + t * DOT_LANES));
    max = _mm512_mask_mov_ps(_mm512_setzero_ps(), live, max); /* unused lanes: no inf - inf */
    const __m512i interleave = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0); /* word 2i: word i of a, 2i + 1: word i of b */
    v16f sum = {0};
    for (int64_t t = 0; t < seq_len; t += 2) {
        v16f e0, e1 = {0};
        const __m512 s0 = _mm512_loadu_ps(scores + t * DOT_LANES);
        e0 = exp16_nonpositive((v16f)_mm512_sub_ps(s0, max));
        sum += e0;
        if (t + 1 < seq_len) {
            const __m512 s1 = _mm512_loadu_ps(scores + (t + 1) * DOT_LANES);
            e1 = exp16_nonpositive((v16f)_mm512_sub_ps(s1, max));
            sum += e1;
        }
        const __m512i words = (__m512i)_mm512_cvtne2ps_pbh((__m512)e1, (__m512)e0);
        /* word k * 16 + i lies in key 2k's scores, read above: in place is safe */
        _mm512_storeu_si512(scores + t / 2 * DOT_LANES,
                            _mm512_permutexvar_epi16(interleave, words));
    }
    for (int64_t i = 0; i < n; i++) inv_sum[i] = 1.0f / sum[i];
}

/* 32 output dimensions in order at `out` from the sums against one block's unpacklo (lo)
 * and unpackhi (hi) value pairs: lane l of lo holds dimension 8 * (l / 4) + l % 4, of hi the
 * same + 4 (interleave_values). */
static inline void store_interleaved_sums(float *out, __m512 lo, __m512 hi) {
    const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i second =
        _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    _mm512_storeu_ps(out, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(lo, second, hi));
}

/* Where dot_weigh reads the value pairs: the copy interleave_all_values made, or, where
 * `interleaved` is NULL, the cache itself (`values` at `offsets`), each pair interleaved in
 * registers as it is read. A decode's few rows take the second: its copy served one group of
 * rows, so its stores and its reload from L2 (a head's copy outgrows L1 from ~250 tokens)
 * bought nothing. Same products in the same order either way: the same bits. Read from the
 * cache, the value rows DOT_PREFETCH_ROWS ahead are fetched as the copy's loop fetched them
 * (dot_scores_by_row fetches the keys likewise; without that a decode call was 0.93-0.95x,
 * with it 1.12-1.33x: 16 and 64 sequences of ~176-300 tokens from memory,
 * `benchmarks.cpu_attention_ab`), and each 8 values take a step of `ahead` (NULL: none). */
typedef struct {
    const __m512i *interleaved;
    const uint16_t *values;
    const int64_t *offsets;
    lookahead *ahead;
} value_pairs;

/* The 4 zmm of value pairs (keys t and t + 1) for dimensions b .. b + 63, laid out as
 * interleave_values lays them out. */
static inline __attribute__((always_inline)) void load_value_pairs(
    __m512bh v[4], const value_pairs *src, const int from_cache, int64_t t, int64_t seq_len,
    int64_t b, int64_t d) {
    static const uint16_t past_context[DOT_MAX_HEAD_DIM]; /* the odd context's missing row */
    if (!from_cache) {
        const __m512i *at = src->interleaved + t / 2 * (d / 16) + b / 16;
        for (int k = 0; k < 4; k++) v[k] = (__m512bh)_mm512_loadu_si512(at + k);
        return;
    }
    const uint16_t *row = src->values + src->offsets[t] + b;
    const uint16_t *next = t + 1 < seq_len ? src->values + src->offsets[t + 1] + b : past_context;
    const __m512i a0 = _mm512_loadu_si512(row), a1 = _mm512_loadu_si512(row + 32);
    const __m512i b0 = _mm512_loadu_si512(next), b1 = _mm512_loadu_si512(next + 32);
    v[0] = (__m512bh)_mm512_unpacklo_epi16(a0, b0);
    v[1] = (__m512bh)_mm512_unpackhi_epi16(a0, b0);
    v[2] = (__m512bh)_mm512_unpacklo_epi16(a1, b1);
    v[3] = (__m512bh)_mm512_unpackhi_epi16(a1, b1);
}

/* dot_weigh for `rows` rows from r0 (a constant where inlined: the 6 x 4 sums then stay in
 * registers, where a loop bound known only at run time spills them to the stack each pair;
 * from_cache too, so that each form has its own loop). */
static inline __attribute__((always_inline)) void dot_weigh_group(
    float *acc, const float *weights, int64_t pair_step, int64_t row_step, int64_t r0,
    const int rows, int64_t seq_len, int64_t d, const value_pairs *src, const int from_cache) {
    for (int64_t b = 0; b < d; b += 64) { /* 64 dimensions: 4 zmm of pairs */
        __m512 sums[DOT_ROW_GROUP][4];
        for (int i = 0; i < rows; i++)
            for (int k = 0; k < 4; k++) sums[i][k] = _mm512_setzero_ps();
        for (int64_t t = 0; t < seq_len; t += 2) {
            if (from_cache && b == 0) {
                if (t % 8 == 0) lookahead_step(src->ahead);
                prefetch_rows(src->values, src->offsets, t + DOT_PREFETCH_ROWS, 2, seq_len, d);
            }
            __m512bh v[4];
            load_value_pairs(v, src, from_cache, t, seq_len, b, d);
            for (int i = 0; i < rows; i++) {
                int32_t w;
                memcpy(&w, weights + t / 2 * pair_step + (r0 + i) * row_step, 4);
                const __m512bh wp = (__m512bh)_mm512_set1_epi32(w);
                for (int k = 0; k < 4; k++) sums[i][k] = _mm512_dpbf16_ps(sums[i][k], wp, v[k]);
            }
        }
        for (int i = 0; i < rows; i++)
            for (int k = 0; k < 4; k += 2)
                store_interleaved_sums(acc + (r0 + i) * d + b + k / 2 * 32, sums[i][k],
                                       sums[i][k + 1]);
    }
}

/* acc[i * d + c] = sum over keys of row i's bf16 weight times value [c], for rows i < n: the
 * weights of row i, keys 2k and 2k + 1, are the 32-bit word k * pair_step + i * row_step of
 * `weights`; the values as `src` says (value_pairs). */
static void dot_weigh(float *acc, const float *weights, int64_t pair_step, int64_t row_step,
                      int64_t n, int64_t seq_len, int64_t d, value_pairs src) {
    const int from_cache = src.interleaved == NULL;
    for (int64_t r0 = 0; r0 < n; r0 += DOT_ROW_GROUP, src.ahead = NULL) { /* one pass's steps */
        const int64_t rows = n - r0 < DOT_ROW_GROUP ? n - r0 : DOT_ROW_GROUP;
#define WEIGH_GROUP(R)                                                                         \
    case R:                                                                                    \
        if (from_cache)                                                                        \
            dot_weigh_group(acc, weights, pair_step, row_step, r0, R, seq_len, d, &src, 1);    \
        else                                                                                   \
            dot_weigh_group(acc, weights, pair_step, row_step, r0, R, seq_len, d, &src, 0);    \
        break;
        switch (rows) {
            WEIGH_GROUP(1) WEIGH_GROUP(2) WEIGH_GROUP(3) WEIGH_GROUP(4) WEIGH_GROUP(5)
            WEIGH_GROUP(6)
        }
#undef WEIGH_GROUP
    }
}

/* Softmax weights laid out by row (row r at weights + r * stride, 0 past its visible keys up
 * to stride, as softmax_rows leaves them) rounded to bf16 in place: pair k of row r becomes the
 * 32-bit word r * stride + k, as dot_weigh reads with pair_step 1 and row_step stride. */
static void dot_round_rows(float *weights, int64_t stride, int64_t rows, int64_t seq_len) {
    const int64_t used = seq_len + (seq_len & 1); /* <= stride */
    for (int64_t r = 0; r < rows; r++) {
        float *row = weights + r * stride;
        for (int64_t t = 0; t < used; t += 32) { /* the bf16 of t..t+31 land on words t/2.. */
            const int64_t left = used - t;
            const __mmask16 lo = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            const __mmask16 hi = left >= 32   ? 0xffff
                                 : left <= 16 ? 0
                                              : (__mmask16)((1u << (left - 16)) - 1);
            const __mmask32 both = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1);
            const __m512 a = _mm512_maskz_loadu_ps(lo, row + t);
            const __m512 b = _mm512_maskz_loadu_ps(hi, row + t + 16);
            _mm512_mask_storeu_epi16((uint16_t *)row + t, both,
                                     (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
}

/* Rows [row0, row0 + n) (n <= 16) of one (sequence, KV head): acc[i * d ...] gets row row0 + i's
 * unnormalized output and inv_sum[i] its normalizer. Row i sees keys t <= last[i] (< seq_len);
 * keys no row of the block sees are not read. next_head and ahead as in dot_scores.
 * scratch: seq_len * 16 floats (rounded up to even seq_len). */
static void dot_attend_rows(float *acc, float *inv_sum, const uint16_t *const *query_rows,
                            const int64_t *last, int64_t n, const void *k_cache,
                            const void *v_cache, const int64_t *offsets, int64_t seq_len,
                            int64_t d, float scale, const __m512i *interleaved,
                            int64_t next_head, lookahead *ahead, float *scratch) {
    int64_t keys = 0; /* the keys some row of the block sees: a prompt's early rows see few */
    for (int64_t i = 0; i < n; i++) keys = last[i] + 1 > keys ? last[i] + 1 : keys;
    dot_scores(scratch, query_rows, n, k_cache, v_cache, offsets, keys, d, scale, next_head,
               ahead);
    dot_softmax(scratch, last, n, keys, inv_sum);
    dot_weigh(acc, scratch, DOT_LANES, 1, n, keys, d, (value_pairs){interleaved, NULL, NULL, NULL});
}

#endif
