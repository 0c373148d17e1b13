/* Paged attention on the CPU in one pass over the cache: no gathered copy of K/V.
 *
 * Every sequence's new tokens (one for a decode, a few for a short chunk) attend causally to
 * its whole context, read in place from the paged cache through its block table. Threads
 * take whole sequences (one thread reads all of a block's heads: 1.5x faster on 2 threads
 * than splitting a sequence's KV heads between them), each claiming its next one before it
 * attends the last, whose rows it fetches meanwhile (cpu_attention_lookahead.h). A float32
 * decode's or verification's rows go by row over all the sequence's KV heads at once, one pass
 * over its keys and one over its values, the rows ahead fetched between the rows' arithmetic
 * (cpu_attention_by_sequence.h: the same bits as by KV head, 1.1-1.3x a call; where a core
 * has 1 MiB of L2 a single-token decode goes by KV head, see single_decodes_by_sequence). A
 * prompt whose work is more than a quarter of a thread's share (bf16) is split into units of
 * rows instead, so that one long prompt does not leave the other threads waiting; within one,
 * each (sequence, KV head) pair scores all the query heads that share that KV head, for all
 * its new tokens, so each cached key and value row is read once. Softmax is exact
 * (max-subtracted, over the full row) and in float32 whatever the cache dtype; bf16 is widened
 * by a shift (bf16 is the top half of a float32).
 *
 * Vectorized with GCC vector extensions (8 floats): scores for 8 keys at a time with one
 * accumulator per key, summed across lanes by a shuffle tree instead of one horizontal sum
 * per key; a polynomial exp (Cephes' expf) 8 at a time in place of libm's scalar expf; the
 * weighted sum of values in register accumulators, two query rows and 32 floats of a row at
 * a time (8 independent sums, each value load serving both rows: 1.04-1.21x faster a call
 * than one row and 4 sums, bit-identical, at 1-64 sequences of 176-300 tokens, 1 or 4 new
 * tokens each, fp32 and bf16, 2 threads); the scores' maximum 8 lanes at a time. The score
 * loop was also tried on two rows sharing each key load (4 keys a pass): no faster. Much of
 * what is left is reading the cache: the first KV head's pass over a sequence reads its
 * blocks from memory, so the score loop prefetches the key and value rows PREFETCH_TILES
 * tiles ahead (64 sequences of ~300 tokens: 1.13-1.31x a call; 16: 1.01-1.10x; one
 * sequence, whose rows are cached already, 0.92-0.96x, 2-3 us). head_dim must be a
 * multiple of 8.
 *
 * A prompt's chunk has many rows a (sequence, KV head), and by row each reads its whole
 * context, visible or not: such chunks go through lanes instead, 16 rows a block, rows in the
 * lanes of vectors, each block reading only the keys its rows see (bf16 on AVX512-BF16:
 * cpu_attention_bf16_dot.h from 8 rows; float32: cpu_attention_f32_lanes.h from 17 new
 * tokens), and a long one is shared between threads in units of rows (attend_rows).
 *
 * Layouts (those of kernels/reference.py):
 *   q, out        [T, Hq, D]            q's row t at t * q_row_stride; out contiguous
 *   k/v cache     [N, BS, Hkv, D]       contiguous
 *   block_tables  [S, max_blocks] int32
 *   seq_lens      [S] int32             context length after this step's writes
 *   query_start   [S + 1] int32         sequence s's new tokens are rows
 *                                       [query_start[s], query_start[s + 1]) and sit at the
 *                                       last positions of its context
 *   seqs          [num_seqs] int32      the sequences to attend (others' rows are untouched)
 * Returns 0, or -1 if scratch memory could not be allocated.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_attention_fetch.h"
#include "cpu_attention_lookahead.h"
#include "cpu_bf16.h"
#include "cpu_exp.h"

#ifdef __AVX512BF16__
#include "cpu_attention_bf16_dot.h"
#endif

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));

#define TILE 8      /* keys scored together: one v8f of scores */
#define PARALLEL_MIN_WORK 4096
#define PREFETCH_TILES 2 /* tiles ahead the score loop prefetches K and V rows (4: no better) */

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* Row `src` (d elements, float32 or bf16; d a multiple of 8) as float32 in `dst`. */
static inline void widen_row(float *restrict dst, const void *src, int64_t d, int is_bf16) {
    if (is_bf16) {
        const char *s = (const char *)src;
        for (int64_t i = 0; i < d; i += 8) {
            v8u16 half;
            memcpy(&half, s + 2 * i, sizeof half);
            const v8i bits = __builtin_convertvector(half, v8i) << 16;
            memcpy(dst + i, &bits, sizeof bits);
        }
    } else {
        memcpy(dst, src, (size_t)d * sizeof(float));
    }
}

/* Cached row `offset` (elements) of `cache` as float32: in place for a float32 cache, widened
 * into `buffer` (d floats) for a bf16 one. */
static inline const float *cached_row(const void *cache, int64_t offset, int64_t d, int is_bf16,
                                      float *buffer) {
    if (!is_bf16) return (const float *)cache + offset;
    widen_row(buffer, (const uint16_t *)cache + offset, d, 1);
    return buffer;
}

static inline void store_row(void *dst, const float *restrict src, float scale, int64_t d,
                             int is_bf16) {
    if (is_bf16) {
        uint16_t *o = (uint16_t *)dst;
        for (int64_t i = 0; i < d; i++) o[i] = float_to_bf16(src[i] * scale);
    } else {
        float *o = (float *)dst;
        for (int64_t i = 0; i < d; i++) o[i] = src[i] * scale;
    }
}

/* Lane i of the result is the sum of the lanes of a[i]. */
static inline v8f sum_lanes8(const v8f a[8]) {
    const v8i even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
    const v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8f pair[4], quad[2];
    for (int i = 0; i < 4; i++)
        pair[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], even) +
                  __builtin_shuffle(a[2 * i], a[2 * i + 1], odd);
    for (int i = 0; i < 2; i++)
        quad[i] = __builtin_shuffle(pair[2 * i], pair[2 * i + 1], lo2) +
                  __builtin_shuffle(pair[2 * i], pair[2 * i + 1], hi2);
    return __builtin_shuffle(quad[0], quad[1], lo4) + __builtin_shuffle(quad[0], quad[1], hi4);
}

DEFINE_EXP_NONPOSITIVE(exp8_nonpositive, v8f, v8i) /* cpu_exp.h, 8 lanes */

#include "cpu_attention_f32_lanes.h" /* uses v8f, load8, store8, exp8_nonpositive */

/* offsets[t]: where token t's row for `kv_head` starts in either cache, in elements. */
static void row_offsets(int64_t *offsets, const int32_t *table, int64_t seq_len,
                        int64_t block_size, int64_t cache_row, int64_t kv_head, int64_t d) {
    for (int64_t start = 0, b = 0; start < seq_len; start += block_size, b++) {
        const int64_t base = (int64_t)table[b] * block_size * cache_row + kv_head * d;
        const int64_t end = start + block_size < seq_len ? start + block_size : seq_len;
        for (int64_t t = start; t < end; t++) offsets[t] = base + (t - start) * cache_row;
    }
}

/* Fetch the key and value rows of every KV head of a sequence's tokens into L2 (as many tokens
 * as WARM_BYTES hold), before its first head is attended; `offsets` are head 0's, the start
 * of each token's rows. A thread attends a sequence's KV heads one after the other, each pass
 * fetching its own rows a few tokens ahead: that left only a few misses in flight, and the
 * cache was read at ~9 GB/s where the machine reads ~25. Issued together, the misses overlap
 * (2-core Zen 4, 16-64 sequences of 176-300 tokens, 1 or 4 new tokens each, KV rows from
 * memory: bf16 1.17-1.29x a call, fp32 1.10-1.22x; benchmarks/results/cpu_attention/
 * 2026-12-05_warm_sequence.md). */
static void warm_sequence(const void *k_cache, const void *v_cache, const int64_t *offsets,
                          int64_t seq_len, int64_t row_bytes, int64_t elem) {
    const int64_t tokens = warm_tokens(seq_len, row_bytes);
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t b = 0; b < row_bytes; b += 64) {
            __builtin_prefetch((const char *)k_cache + offsets[t] * elem + b, 0, 2);
            __builtin_prefetch((const char *)v_cache + offsets[t] * elem + b, 0, 2);
        }
}

/* scores[r * stride + t] = scale * <query r, key t> for t in [0, seq_len), 8 keys at a time;
 * the K and V rows PREFETCH_TILES tiles ahead are prefetched (V for weigh_values), and a tile's
 * share of the thread's next sequence (`ahead`, NULL: none). */
static void score_keys(float *scores, int64_t stride, const float *queries, int64_t rows,
                       const void *k_cache, const void *v_cache, const int64_t *offsets,
                       int64_t seq_len, int64_t d, float scale, int is_bf16, float *tile,
                       lookahead *ahead) {
    const int64_t elem = is_bf16 ? 2 : 4;
    for (int64_t t0 = 0; t0 < seq_len; t0 += TILE) {
        const float *key[TILE];
        lookahead_step(ahead);
        for (int64_t t = t0 + PREFETCH_TILES * TILE; t < t0 + (PREFETCH_TILES + 1) * TILE &&
                                                      t < seq_len; t++)
            for (int64_t b = 0; b < d * elem; b += 64) {
                __builtin_prefetch((const char *)k_cache + offsets[t] * elem + b);
                __builtin_prefetch((const char *)v_cache + offsets[t] * elem + b);
            }
        for (int64_t k = 0; k < TILE; k++) {
            const int64_t t = t0 + k < seq_len ? t0 + k : t0; /* past the end: any valid row */
            key[k] = cached_row(k_cache, offsets[t], d, is_bf16, tile + k * d);
        }
        const int64_t valid = seq_len - t0 < TILE ? seq_len - t0 : TILE;
        for (int64_t r = 0; r < rows; r++) {
            const float *q = queries + r * d;
            v8f acc[TILE] = {0};
            for (int64_t c = 0; c < d; c += 8) {
                const v8f qc = load8(q + c);
                for (int k = 0; k < TILE; k++) acc[k] += qc * load8(key[k] + c);
            }
            v8f s = sum_lanes8(acc) * scale;
            if (valid == TILE) {
                store8(scores + r * stride + t0, s);
            } else {
                for (int64_t k = 0; k < valid; k++) scores[r * stride + t0 + k] = s[k];
            }
        }
    }
}

/* The largest of x[0 .. n) (-inf for none; NaNs are passed over, as by a scalar
 * `x > max ? x : max`): 8 running maxima, then their largest. */
static inline float max_of(const float *x, int64_t n) {
    v8f m = (v8f){0} - INFINITY;
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const v8f v = load8(x + t);
        const v8i greater = v > m;
        m = (v8f)(((v8i)v & greater) | ((v8i)m & ~greater));
    }
    float max = -INFINITY;
    for (int i = 0; i < 8; i++) max = m[i] > max ? m[i] : max;
    for (; t < n; t++) max = x[t] > max ? x[t] : max;
    return max;
}

/* Row r's scores become unnormalized softmax weights over its first visible keys (0 past
 * them, up to the row's padded stride); 1 / their sum goes to inv_sum[r]. */
static void softmax_rows(float *scores, int64_t stride, int64_t rows, int64_t first_pos,
                         int64_t group, float *inv_sum) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t visible = first_pos + r / group + 1;
        float *row = scores + r * stride;
        const float max = max_of(row, visible);
        for (int64_t t = visible; t < stride; t++) row[t] = -INFINITY;
        v8f sum = {0};
        for (int64_t t = 0; t < stride; t += 8) {
            const v8f e = exp8_nonpositive(load8(row + t) - max);
            store8(row + t, e);
            sum += e;
        }
        float total = 0.0f;
        for (int i = 0; i < 8; i++) total += sum[i];
        inv_sum[r] = 1.0f / total;
    }
}

/* acc[r * d + 8 k] for ROWS rows and WIDTH / 8 vectors += sum over t < n of
 * weights[r * stride + t] * value t [vc + 8 k]: ROWS * WIDTH / 8 sums in registers, continued
 * from what acc holds, each value load shared by the ROWS rows. Every lane adds its terms in
 * the order of t, whatever ROWS and WIDTH, and a sum run over the values in chunks (by
 * sequence) is the same chain as one run over them all (by pair). */
#define WEIGH(ROWS, WIDTH)                                                                    \
    static inline void weigh_##ROWS##x##WIDTH(float *acc, int64_t d, const float *weights,   \
                                               int64_t stride, const float **value,          \
                                               int64_t n, int64_t vc) {                      \
        v8f a[ROWS][WIDTH / 8];                                                              \
        for (int r = 0; r < ROWS; r++)                                                       \
            for (int k = 0; k < WIDTH / 8; k++) a[r][k] = load8(acc + r * d + 8 * k);        \
        for (int64_t t = 0; t < n; t++) {                                                    \
            v8f p[ROWS];                                                                     \
            for (int r = 0; r < ROWS; r++) p[r] = (v8f){0} + weights[r * stride + t];        \
            for (int k = 0; k < WIDTH / 8; k++) {                                            \
                const v8f x = load8(value[t] + vc + 8 * k);                                  \
                for (int r = 0; r < ROWS; r++) a[r][k] += p[r] * x;                          \
            }                                                                                \
        }                                                                                    \
        for (int r = 0; r < ROWS; r++)                                                       \
            for (int k = 0; k < WIDTH / 8; k++) store8(acc + r * d + 8 * k, a[r][k]);        \
    }
WEIGH(2, 32) /* 8 independent sums: both FMA units busy, 6 loads for 8 FMAs */
WEIGH(2, 8)
WEIGH(1, 64)
WEIGH(1, 32)
WEIGH(1, 8)

/* The slices (passes over the values) weigh_rows makes for `rows` rows of head_dim d. */
static inline int64_t weigh_slices(int64_t rows, int64_t d) {
    return rows / 2 * (d / 32 + d % 32 / 8) + rows % 2 * (d / 64 + d % 64 / 32 + d % 32 / 8);
}

/* acc[r * d ...] += sum over t < n of weights[r * stride + t] * value t [vc ...], d floats, for
 * `rows` rows: two rows at a time, 32 floats a slice, the odd row last; each slice after a
 * `share` of the fetching up to row `target` (fetch NULL: none). */
static inline void weigh_rows(float *acc, const float *weights, int64_t stride, int64_t rows,
                              const float **value, int64_t n, int64_t d, int64_t vc,
                              seq_fetch *fetch, int64_t target, int64_t share) {
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        float *out = acc + r * d;
        const float *w = weights + r * stride;
        int64_t c = 0;
        for (; c + 32 <= d; c += 32) {
            seq_fetch_to(fetch, target, share);
            weigh_2x32(out + c, d, w, stride, value, n, vc + c);
        }
        for (; c < d; c += 8) {
            seq_fetch_to(fetch, target, share);
            weigh_2x8(out + c, d, w, stride, value, n, vc + c);
        }
    }
    if (r < rows) {
        float *out = acc + r * d;
        const float *w = weights + r * stride;
        int64_t c = 0;
        for (; c + 64 <= d; c += 64) {
            seq_fetch_to(fetch, target, share);
            weigh_1x64(out + c, d, w, stride, value, n, vc + c);
        }
        for (; c + 32 <= d; c += 32) {
            seq_fetch_to(fetch, target, share);
            weigh_1x32(out + c, d, w, stride, value, n, vc + c);
        }
        for (; c < d; c += 8) {
            seq_fetch_to(fetch, target, share);
            weigh_1x8(out + c, d, w, stride, value, n, vc + c);
        }
    }
}

/* acc[r * d ...] = sum over t of weights[r * stride + t] * value t. `rows_f` receives the
 * value rows as float32 (bf16 ones are widened there; float32 ones are used in place). */
static void weigh_values(float *acc, const float *weights, int64_t stride, int64_t rows,
                         const void *v_cache, const int64_t *offsets, int64_t seq_len, int64_t d,
                         int is_bf16, float *rows_f, const float **value) {
    for (int64_t t = 0; t < seq_len; t++)
        value[t] = cached_row(v_cache, offsets[t], d, is_bf16, rows_f + t * d);
    memset(acc, 0, (size_t)(rows * d) * sizeof(float));
    weigh_rows(acc, weights, stride, rows, value, seq_len, d, 0, NULL, 0, 0);
}

#include "cpu_attention_by_sequence.h" /* uses the above */

/* Whether a bf16 cache is attended with vdpbf16ps (built for it, and head_dim one
 * cpu_attention_bf16_dot.h serves). */
static inline int on_dot_path(int64_t d, int is_bf16) {
#ifdef __AVX512BF16__
    return is_bf16 && dot_supports(d);
#else
    (void)d, (void)is_bf16;
    return 0;
#endif
}

#define LANES 16 /* rows a block on either path's lanes: DOT_LANES, F32_LANES */

/* Whether a float32 decode of one new token goes by sequence (1, the default) or by pair, for
 * the whole process (paged_attention_set_single_decodes_by_sequence; the worker sets it at
 * start from the core's L2, services/gpu_worker/platforms/cpu.py). By pair the lookahead
 * fetches the next sequence's rows whole into L2 (up to WARM_BYTES, 512 KiB); where a core has
 * 1 MiB of L2 that was faster: 2-core Zen 4, 64 sequences of ~300 tokens, by sequence took
 * 1.26-1.36x as long a call (AVX2 build and AVX-512 build), 1.07-1.10x at 16 of ~176, while
 * with 4 new tokens by sequence stayed faster (0.89-0.93x as long). On a Zen 3, 512 KiB of L2,
 * by sequence took 0.72-0.76x as long at 16-64 single-token decodes. The same bits either way. */
static int single_decodes_by_sequence = 1;

/* Whether a pair's rows (num_new new tokens, `group` query heads a KV head) go through lanes:
 * the bf16 dot path's (dot_attend_rows), or a float32 prompt chunk's (f32_attend_rows). */
static inline int on_lanes(int64_t num_new, int64_t group, int64_t d, int is_bf16) {
    if (!is_bf16) return num_new >= F32_LANES_MIN_NEW && f32_lanes_support(d);
#ifdef __AVX512BF16__
    return on_dot_path(d, is_bf16) && num_new * group >= DOT_MIN_ROWS;
#else
    (void)group;
    return 0; /* no dot path in this build */
#endif
}

/* Whether a whole sequence's rows are attended by row, all KV heads in one pass
 * (cpu_attention_by_sequence.h): a float32 cache's decodes and verifications, up to
 * SEQ_MAX_NEW new tokens (by sequence, chunks of 12-16 new tokens took 1.05x as long a call,
 * chunks of 8 0.92-0.96x; 2-core Zen 3). A bf16 cache off the dot path (an AVX2 build) keeps
 * the pairs: by sequence its prompts, all by row there, took 1.2-1.3x as long a call and its
 * verifications 1.06-1.09x (against 1.07-1.13x faster single-token decodes).
 * Single-token decodes only where `singles` (single_decodes_by_sequence, read once a call). */
static inline int by_sequence(int64_t num_new, int64_t group, int64_t d, int is_bf16,
                              int singles) {
    return !is_bf16 && num_new <= SEQ_MAX_NEW && (num_new > 1 || singles) &&
           !on_lanes(num_new, group, d, is_bf16);
}

/* Rows of scores a pair's scratch holds: all its rows by row, or LANES rows per key on lanes
 * (a block of LANES rows at a time, however long the chunk). */
static inline int64_t score_rows(int64_t num_new, int64_t group, int64_t d, int is_bf16) {
    return on_lanes(num_new, group, d, is_bf16) ? LANES : num_new * group;
}

/* query_rows[i] and last[i] for rows r0 + i (i < n) of one (sequence, KV head) whose new
 * tokens are q's rows from first_row: row (j, g) is new token j's query head
 * kv_head * group + g, and sees the keys up to seq_len - num_new + j. */
static void lane_rows(const void **query_rows, int64_t *last, const void *q, int64_t q_row_stride,
                      int64_t first_row, int64_t r0, int64_t n, int64_t kv_head, int64_t group,
                      int64_t seq_len, int64_t num_new, int64_t d, int64_t elem) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t j = (r0 + i) / group, head = kv_head * group + (r0 + i) % group;
        query_rows[i] = (const char *)q + ((first_row + j) * q_row_stride + head * d) * elem;
        last[i] = seq_len - num_new + j;
    }
}

/* Rows [0, rows) of one (sequence, KV head) through lanes, LANES at a time: acc[r * d ...]
 * gets row r's unnormalized output, inv_sum[r] its normalizer. query_rows and last as
 * lane_rows leaves them; interleaved: the bf16 dot path's value pairs (else unused);
 * next_head and ahead as dot_scores takes them (the float32 lanes fetch neither). scratch:
 * LANES * seq_len floats. */
static void attend_lanes(float *acc, float *inv_sum, const void **query_rows, const int64_t *last,
                         int64_t rows, const void *k_cache, const void *v_cache,
                         const int64_t *offsets, int64_t seq_len, int64_t d, float scale,
                         int is_bf16, const void *interleaved, int64_t next_head,
                         lookahead *ahead, float *scratch) {
    for (int64_t r0 = 0; r0 < rows; r0 += LANES) {
        const int64_t n = rows - r0 < LANES ? rows - r0 : LANES;
#ifdef __AVX512BF16__
        if (is_bf16) {
            dot_attend_rows(acc + r0 * d, inv_sum + r0, (const uint16_t *const *)query_rows + r0,
                            last + r0, n, k_cache, v_cache, offsets, seq_len, d, scale,
                            (const __m512i *)interleaved, r0 == 0 ? next_head : 0, ahead,
                            scratch);
            continue;
        }
#else
        (void)is_bf16, (void)interleaved, (void)next_head, (void)ahead, (void)seq_len;
#endif
        f32_attend_rows(acc + r0 * d, inv_sum + r0, (const float *const *)query_rows + r0,
                        last + r0, n, (const float *)k_cache, (const float *)v_cache, offsets, d,
                        scale, scratch);
    }
}

/* One (sequence, KV head) pair: rows = num_new * group query rows; row (j, g) is new token j's
 * query head kv_head * group + g and sees the first seq_len - num_new + j + 1 keys.
 * scratch: scores (rows * stride), accumulators and queries (rows * d each), a tile of
 * TILE * d widened rows, rows normalizers, seq_len widened value rows (bf16), then seq_len
 * row offsets, seq_len value row pointers, rows query row pointers and rows last keys (8
 * bytes, 2 floats each). The scores take score_rows(...) * stride floats. whole_sequence:
 * this thread takes all the sequence's KV heads, one after the other (it fetches every head's
 * rows before the first unless `warm` says its predecessor fetched them; the bf16 dot path
 * also fetches the next head's rows while this one computes). `ahead`: the thread's next
 * sequence, fetched a step per tile of keys scored (NULL: none).
 * Inlined into its callers, as GCC chose until the order of single decodes became a setting:
 * left to itself it then kept this one out of line and inlined more into attend_sequence,
 * whose calls of 4 new tokens took 1.03-1.08x as long (2-core Zen 4, `python -m
 * benchmarks.cpu_attention_ab`); inlined, they are as fast as before. */
static inline __attribute__((always_inline)) void attend_pair(
    void *out, const void *q, int64_t q_row_stride, const void *k_cache, const void *v_cache,
    const int32_t *table, int64_t seq_len, int64_t first_row, int64_t num_new, int64_t kv_head,
    int64_t num_heads, int64_t num_kv_heads, int64_t d, int64_t block_size, float scale,
    int is_bf16, int whole_sequence, int warm, lookahead *ahead, float *scratch) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t rows = num_new * group;
    const int64_t elem = is_bf16 ? 2 : 4;
    const int64_t cache_row = num_kv_heads * d; /* elements between tokens in a block */
    const int64_t stride = (seq_len + TILE - 1) / TILE * TILE;
    float *scores = scratch;
    float *acc = scores + score_rows(num_new, group, d, is_bf16) * stride;
    float *queries = acc + rows * d;
    float *tile = queries + rows * d;
    float *inv_sum = tile + TILE * d;
    float *rows_f = inv_sum + rows + (rows & 1);
    int64_t *offsets = (int64_t *)(rows_f + seq_len * d); /* 8-byte aligned: d % 8 == 0 */
    const void **query_rows = (const void **)(offsets + 2 * seq_len);
    int64_t *last = (int64_t *)(query_rows + rows);

    row_offsets(offsets, table, seq_len, block_size, cache_row, kv_head, d);
    if (whole_sequence && kv_head == 0 && !warm)
        warm_sequence(k_cache, v_cache, offsets, seq_len, cache_row * elem, elem);
    const int lanes = on_lanes(num_new, group, d, is_bf16);
    if (lanes || on_dot_path(d, is_bf16))
        lane_rows(query_rows, last, q, q_row_stride, first_row, 0, rows, kv_head, group, seq_len,
                  num_new, d, elem);
    const int next_head_follows = whole_sequence && kv_head + 1 < num_kv_heads;
    const int64_t next_head = next_head_follows ? d : 0; /* its rows: d elements on */
    if (lanes) {
#ifdef __AVX512BF16__
        if (is_bf16)
            interleave_all_values((__m512i *)rows_f, k_cache, v_cache, offsets, seq_len, d,
                                  ahead);
#endif
        attend_lanes(acc, inv_sum, query_rows, last, rows, k_cache, v_cache, offsets, seq_len, d,
                     scale, is_bf16, rows_f, next_head, ahead, scores);
    }
#ifdef __AVX512BF16__
    else if (on_dot_path(d, is_bf16)) { /* a decode's few rows would leave most lanes empty */
        dot_scores_by_row(scores, stride, (const uint16_t *const *)query_rows, rows, k_cache,
                          v_cache, offsets, seq_len, d, scale, next_head, ahead);
        softmax_rows(scores, stride, rows, seq_len - num_new, group, inv_sum);
        dot_round_rows(scores, stride, rows, seq_len);
        dot_weigh(acc, scores, 1, stride, rows, seq_len, d,
                  (value_pairs){NULL, (const uint16_t *)v_cache, offsets, ahead});
    }
#endif
    else {
        for (int64_t r = 0; r < rows; r++)
            widen_row(queries + r * d,
                      (const char *)q + ((first_row + r / group) * q_row_stride +
                                         (kv_head * group + r % group) * d) * elem,
                      d, is_bf16);
        score_keys(scores, stride, queries, rows, k_cache, v_cache, offsets, seq_len, d, scale,
                   is_bf16, tile, ahead);
        softmax_rows(scores, stride, rows, seq_len - num_new, group, inv_sum);
        weigh_values(acc, scores, stride, rows, v_cache, offsets, seq_len, d, is_bf16, rows_f,
                     (const float **)(offsets + seq_len));
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t j = r / group, head = kv_head * group + r % group;
        char *dst = (char *)out + ((first_row + j) * num_heads + head) * d * elem;
        store_row(dst, acc + r * d, inv_sum[r], d, is_bf16);
    }
}

#define UNITS_PER_THREAD 4 /* a split chunk: units of about work / (threads * this) */

/* Rows of a chunk's (sequence, KV head) a unit of split work takes, in whole LANES-row
 * blocks: 0 where the sequence stays whole (not on lanes, one block, or its work,
 * rows * seq_len * num_kv_heads, within a unit's). */
static inline int64_t rows_per_unit(int64_t num_new, int64_t group, int64_t seq_len,
                                    int64_t num_kv_heads, int64_t d, int is_bf16, int64_t work,
                                    int64_t threads) {
    const int64_t rows = num_new * group;
    const int64_t unit_work = work / (UNITS_PER_THREAD * threads);
    if (!on_lanes(num_new, group, d, is_bf16) || rows <= LANES ||
        rows * seq_len * num_kv_heads <= unit_work)
        return 0;
    const int64_t blocks = (unit_work + LANES * seq_len - 1) / (LANES * seq_len);
    return (blocks > 0 ? blocks : 1) * LANES;
}

/* Rows [r_begin, r_end) of one (sequence, KV head) of a chunk on lanes, as a unit of their
 * own: a long prompt's rows are shared between threads. Taken whole, the longest prompt of a
 * prefill step kept one thread busy while the other waited (bf16, a 300- and a 200-token
 * prompt: the other thread spun 44% of the call). Fetches this KV head's rows the rows see
 * first (as warm_sequence does a whole sequence's: without it, a bf16 step of six ~88-token
 * prompts split by KV head took 0.8x), and reads no others. scratch as attend_pair's (it
 * needs less: LANES rows of scores, r_end - r_begin <= the chunk's rows). */
static void attend_rows(void *out, const void *q, int64_t q_row_stride, const void *k_cache,
                        const void *v_cache, const int32_t *table, int64_t seq_len,
                        int64_t first_row, int64_t num_new, int64_t kv_head, int64_t num_heads,
                        int64_t num_kv_heads, int64_t d, int64_t block_size, float scale,
                        int is_bf16, int64_t r_begin, int64_t r_end, float *scratch) {
    const int64_t group = num_heads / num_kv_heads, rows = r_end - r_begin;
    const int64_t elem = is_bf16 ? 2 : 4;
    const int64_t keys = seq_len - num_new + (r_end - 1) / group + 1; /* the last row's */
    const int64_t stride = (seq_len + TILE - 1) / TILE * TILE;
    float *scores = scratch;
    float *acc = scores + LANES * stride;
    float *inv_sum = acc + rows * d;
    float *rows_f = inv_sum + rows + (rows & 1);
    int64_t *offsets = (int64_t *)(rows_f + seq_len * d); /* 8-byte aligned: d % 8 == 0 */
    const void **query_rows = (const void **)(offsets + seq_len);
    int64_t *last = (int64_t *)(query_rows + rows);
    row_offsets(offsets, table, keys, block_size, num_kv_heads * d, kv_head, d);
    warm_sequence(k_cache, v_cache, offsets, keys, d * elem, elem); /* this KV head's rows */
#ifdef __AVX512BF16__
    if (is_bf16)
        interleave_all_values((__m512i *)rows_f, k_cache, v_cache, offsets, keys, d, NULL);
#endif
    lane_rows(query_rows, last, q, q_row_stride, first_row, r_begin, rows, kv_head, group,
              seq_len, num_new, d, elem);
    attend_lanes(acc, inv_sum, query_rows, last, rows, k_cache, v_cache, offsets, keys, d, scale,
                 is_bf16, rows_f, 0, NULL, scores);
    for (int64_t i = 0; i < rows; i++) {
        const int64_t j = (r_begin + i) / group, head = kv_head * group + (r_begin + i) % group;
        char *dst = (char *)out + ((first_row + j) * num_heads + head) * d * elem;
        store_row(dst, acc + i * d, inv_sum[i], d, is_bf16);
    }
}

/* The whole sequences this thread claims from `claimed` (shared by the team), one at a time,
 * each claimed before the last is attended so that its rows are fetched during the last
 * one's scores (cpu_attention_lookahead.h). Threads still take sequences as they come free.
 * `singles`: by_sequence's. scratch NULL (it could not be allocated): claims and attends
 * nothing. */
static void attend_claimed(void *out, const void *q, int64_t q_row_stride, const void *k_cache,
                           const void *v_cache, const int32_t *block_tables, int64_t max_blocks,
                           const int32_t *seq_lens, const int32_t *query_start,
                           const int32_t *seqs, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t d, int64_t block_size, float scale,
                           int is_bf16, int singles, int64_t *claimed, float *scratch) {
    if (scratch == NULL) return;
    const int64_t token_bytes = num_kv_heads * d * (is_bf16 ? 2 : 4);
    int64_t mine, next;
#pragma omp atomic capture
    mine = (*claimed)++;
    int warm = 0; /* whether `mine` was fetched as the last one's lookahead */
    int64_t fetched_ahead = 0; /* its first key rows the last one fetched (attend_sequence) */
    for (; mine < num_seqs; mine = next) {
#pragma omp atomic capture
        next = (*claimed)++;
        const int64_t s = seqs[mine];
        const int64_t num_new = query_start[s + 1] - query_start[s];
        if (num_new > 0 && by_sequence(num_new, num_heads / num_kv_heads, d, is_bf16, singles)) {
            const int64_t n = next < num_seqs ? seqs[next] : -1;
            const int fetch_next = n >= 0 && query_start[n + 1] > query_start[n] &&
                                   by_sequence(query_start[n + 1] - query_start[n],
                                               num_heads / num_kv_heads, d, is_bf16, singles);
            attend_sequence(out, q, q_row_stride, k_cache, v_cache,
                            block_tables + s * max_blocks, seq_lens[s], query_start[s], num_new,
                            num_heads, num_kv_heads, d, block_size, scale, is_bf16,
                            fetched_ahead, fetch_next ? block_tables + n * max_blocks : NULL,
                            fetch_next ? seq_lens[n] : 0, scratch);
            fetched_ahead = fetch_next ? seq_fetched_ahead(seq_lens[n]) : 0;
            warm = 0;
            continue;
        }
        fetched_ahead = 0;
        lookahead ahead, *fetching = NULL;
        if (next < num_seqs && num_new > 0) {
            const int64_t n = seqs[next];
            const int64_t row_blocks = (num_new * (num_heads / num_kv_heads) + 15) / 16;
            /* tiles of keys scored; the bf16 dot path also takes a step every 8 values it
             * interleaves */
            const int64_t passes = row_blocks + on_dot_path(d, is_bf16);
            const int64_t tiles = num_kv_heads * passes * ((seq_lens[s] + 7) / 8);
            lookahead_start(&ahead, k_cache, v_cache, block_tables + n * max_blocks, seq_lens[n],
                            block_size, token_bytes, tiles);
            fetching = &ahead;
        }
        for (int64_t h = 0; h < num_kv_heads && num_new > 0; h++)
            attend_pair(out, q, q_row_stride, k_cache, v_cache, block_tables + s * max_blocks,
                        seq_lens[s], query_start[s], num_new, h, num_heads, num_kv_heads, d,
                        block_size, scale, is_bf16, 1, warm, fetching, scratch);
        lookahead_finish(fetching);
        warm = fetching != NULL && warm_tokens(seq_lens[seqs[next]], token_bytes) ==
                                       seq_lens[seqs[next]]; /* fetched whole */
    }
}

int paged_attention(void *out, const void *q, int64_t q_row_stride, const void *k_cache,
                    const void *v_cache, const int32_t *block_tables, int64_t max_blocks,
                    const int32_t *seq_lens, const int32_t *query_start, const int32_t *seqs,
                    int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                    int64_t block_size, float scale, int is_bf16) {
    const int64_t group = num_heads / num_kv_heads;
    const int singles = single_decodes_by_sequence;
    int64_t most = 0; /* the largest scratch any pair needs */
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t s = seqs[i];
        const int64_t num_new = query_start[s + 1] - query_start[s], rows = num_new * group;
        const int64_t stride = (seq_lens[s] + TILE - 1) / TILE * TILE;
        const int64_t need = score_rows(num_new, group, head_dim, is_bf16) * stride + 2 * rows * head_dim +
                             TILE * head_dim + rows + 1 + (int64_t)seq_lens[s] * head_dim +
                             4 * (int64_t)seq_lens[s] + 4 * rows;
        most = need > most ? need : most;
        if (by_sequence(num_new, group, head_dim, is_bf16, singles)) {
            const int64_t whole =
                seq_scratch(num_new, num_heads, num_kv_heads, seq_lens[s], head_dim);
            most = whole > most ? whole : most;
        }
    }
    int64_t work = 0; /* key rows scored, over all pairs: below PARALLEL_MIN_WORK, waking
                         the other threads costs more than they save */
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t s = seqs[i];
        work += (int64_t)(query_start[s + 1] - query_start[s]) * group * seq_lens[s];
    }
    work *= num_kv_heads;
    /* A chunk on lanes whose work is more than a unit's goes to threads in units
     * of rows (rows_per_unit; the last rows, which see the most keys, first); the other
     * sequences whole, unless there are fewer than threads: then (sequence, KV head) pairs.
     * The split changes no result. */
    const int64_t threads = omp_get_max_threads();
    int64_t num_units = 0, num_whole = 0;
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t s = seqs[i], num_new = query_start[s + 1] - query_start[s];
        const int64_t rows = num_new * group;
        const int64_t per_unit = rows_per_unit(num_new, group, seq_lens[s], num_kv_heads,
                                               head_dim, is_bf16, work, threads);
        if (per_unit)
            num_units += (rows + per_unit - 1) / per_unit * num_kv_heads;
        else
            num_whole++;
    }
    int64_t *units = (int64_t *)malloc((size_t)(4 * num_units + 1) * sizeof(int64_t));
    int32_t *whole = (int32_t *)malloc((size_t)(num_whole + 1) * sizeof(int32_t));
    if (units == NULL || whole == NULL) {
        free(units);
        free(whole);
        return -1;
    }
    for (int64_t i = 0, u = 0, w = 0; i < num_seqs; i++) {
        const int64_t s = seqs[i], num_new = query_start[s + 1] - query_start[s];
        const int64_t rows = num_new * group;
        const int64_t per_unit = rows_per_unit(num_new, group, seq_lens[s], num_kv_heads,
                                               head_dim, is_bf16, work, threads);
        if (!per_unit) {
            whole[w++] = (int32_t)s;
            continue;
        }
        for (int64_t end = rows; end > 0; end -= per_unit)
            for (int64_t h = 0; h < num_kv_heads; h++, u++) {
                units[4 * u] = s;
                units[4 * u + 1] = h;
                units[4 * u + 2] = end > per_unit ? end - per_unit : 0;
                units[4 * u + 3] = end;
            }
    }
    const int by_pair = num_whole < threads;
    int failed = 0;
    int64_t claimed = 0; /* whole sequences claimed so far, by all threads */
#pragma omp parallel if (work >= PARALLEL_MIN_WORK)
    {
        float *scratch = (float *)malloc((size_t)most * sizeof(float));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t u = 0; u < num_units; u++) {
            const int64_t s = units[4 * u];
            if (scratch != NULL)
                attend_rows(out, q, q_row_stride, k_cache, v_cache, block_tables + s * max_blocks,
                            seq_lens[s], query_start[s], query_start[s + 1] - query_start[s],
                            units[4 * u + 1], num_heads, num_kv_heads, head_dim, block_size,
                            scale, is_bf16, units[4 * u + 2], units[4 * u + 3], scratch);
        }
        if (by_pair) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t u = 0; u < num_whole * num_kv_heads; u++) {
                const int64_t s = whole[u / num_kv_heads];
                const int64_t num_new = query_start[s + 1] - query_start[s];
                if (scratch == NULL || num_new == 0) continue;
                attend_pair(out, q, q_row_stride, k_cache, v_cache,
                            block_tables + s * max_blocks, seq_lens[s], query_start[s], num_new,
                            u % num_kv_heads, num_heads, num_kv_heads, head_dim, block_size,
                            scale, is_bf16, 0, 0, NULL, scratch);
            }
        } else {
            attend_claimed(out, q, q_row_stride, k_cache, v_cache, block_tables, max_blocks,
                           seq_lens, query_start, whole, num_whole, num_heads, num_kv_heads,
                           head_dim, block_size, scale, is_bf16, singles, &claimed, scratch);
        }
        free(scratch);
    }
    free(units);
    free(whole);
    return failed ? -1 : 0;
}

/* 1 if this build scores bf16 caches of heads of head_dim with vdpbf16ps (built for a CPU
 * with AVX512-BF16, and head_dim one cpu_attention_bf16_dot.h serves). */
int paged_attention_uses_bf16_dot(int64_t head_dim) { return on_dot_path(head_dim, 1); }

/* 1 if this build attends chunks of any length of a cache of this dtype and head_dim on lanes
 * (the bf16 dot path's, or the float32 ones of cpu_attention_f32_lanes.h), so that no chunk
 * needs SDPA. */
int paged_attention_takes_any_chunk(int64_t head_dim, int is_bf16) {
    return is_bf16 ? on_dot_path(head_dim, 1) : f32_lanes_support(head_dim);
}

/* Sets single_decodes_by_sequence (0 or 1) and returns it. Not while a call runs. */
int paged_attention_set_single_decodes_by_sequence(int on) {
    single_decodes_by_sequence = on != 0;
    return single_decodes_by_sequence;
}
