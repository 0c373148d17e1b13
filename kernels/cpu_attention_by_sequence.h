/* A decode's (or a verification's) rows of one sequence, all its KV heads together: one pass
 * over its keys in token order, then one over its values, each cached row read once, whole.
 * Included by kernels/cpu_paged_attention.c after score_keys' pieces (cached_row, widen_row,
 * row_offsets, sum_lanes8, softmax_rows, weigh_rows, store_row); by_sequence there says which
 * sequences come here (float32 caches, up to SEQ_MAX_NEW new tokens: bf16 rows are widened as
 * by pair, but no bf16 cache is sent here, since an AVX2 build's was slower this way).
 *
 * By (sequence, KV head) pair (attend_pair), a thread read a sequence's cache three times
 * (once a KV head), each pass a third of every token's lines, so the lines had to wait in L2
 * between passes, fetched ahead in bursts (warm_sequence, the lookahead); the cache was read
 * at ~12 GB/s where plain reads of the same scattered blocks run at ~20 (2-core Zen 3, float32,
 * 64 sequences of ~300 tokens). Here the keys of a tile of tokens are read whole and every
 * query row of every head is scored against them; the values are weighed SEQ_CHUNK tokens at a
 * time, every row's accumulators kept in memory between chunks, so a chunk's rows come from
 * memory once and from L1 after. The rows ahead are fetched a few lines between each row's
 * arithmetic (seq_fetch), which keeps misses in flight while the core computes: the order of
 * the loops alone was no faster, the spread fetching made it so.
 *
 * Every score and every output sum is the same chain of operations, in the same order, as by
 * pair (score_keys' dot products, softmax_rows, WEIGH's fused multiply-adds over t from +0):
 * the results are bit-identical to attend_pair's, only the loops' order differs.
 */
#ifndef PAGEDSERVE_CPU_ATTENTION_BY_SEQUENCE_H
#define PAGEDSERVE_CPU_ATTENTION_BY_SEQUENCE_H

#include <stdint.h>
#include <string.h>

#define SEQ_CHUNK 16 /* value rows weighed per pass of every row: 12 KiB of float32 rows */
#define SEQ_AHEAD 16 /* rows fetched ahead of those being read (32: no faster) */
/* the cursor that fetches them: seq_fetch, cpu_attention_fetch.h */
#define SEQ_MAX_NEW 8 /* new tokens a sequence taken this way has at most (see by_sequence) */

/* scores[R * stride + t] for every row R = h * rows + r of every KV head h (rows a head),
 * TILE keys at a time, each key row (all heads) read once. */
static void seq_score_keys(float *scores, int64_t stride, const float *queries, int64_t rows,
                           int64_t num_kv_heads, const void *k_cache, const int64_t *offsets,
                           int64_t seq_len, int64_t d, float scale, int is_bf16, float *tile,
                           seq_fetch *fetch) {
    const int64_t cache_row = num_kv_heads * d;
    for (int64_t t0 = 0; t0 < seq_len; t0 += TILE) {
        const float *key[TILE];
        const int64_t target = t0 + TILE + SEQ_AHEAD;
        const int64_t share = seq_fetch_share(fetch, target, num_kv_heads * rows);
        for (int64_t k = 0; k < TILE; k++) {
            const int64_t t = t0 + k < seq_len ? t0 + k : t0; /* past the end: any valid row */
            key[k] = cached_row(k_cache, offsets[t], cache_row, is_bf16, tile + k * cache_row);
        }
        const int64_t valid = seq_len - t0 < TILE ? seq_len - t0 : TILE;
        for (int64_t h = 0; h < num_kv_heads; h++)
            for (int64_t r = 0; r < rows; r++) {
                const float *q = queries + (h * rows + r) * d;
                seq_fetch_to(fetch, target, share);
                v8f acc[TILE] = {0};
                for (int64_t c = 0; c < d; c += 8) {
                    const v8f qc = load8(q + c);
                    for (int k = 0; k < TILE; k++) acc[k] += qc * load8(key[k] + h * d + c);
                }
                v8f s = sum_lanes8(acc) * scale;
                float *row = scores + (h * rows + r) * stride + t0;
                if (valid == TILE) {
                    store8(row, s);
                } else {
                    for (int64_t k = 0; k < valid; k++) row[k] = s[k];
                }
            }
        seq_fetch_to(fetch, target, INT64_MAX);
    }
}

/* acc[R * d ...] = sum over t of weights[R * stride + t] * value t's head h part, for every
 * row R = h * rows + r, SEQ_CHUNK value rows at a time (widened into rows_f for bf16). */
static void seq_weigh_values(float *acc, const float *weights, int64_t stride, int64_t rows,
                             int64_t num_kv_heads, const void *v_cache, const int64_t *offsets,
                             int64_t seq_len, int64_t d, int is_bf16, float *rows_f,
                             const float **value, seq_fetch *fetch) {
    const int64_t cache_row = num_kv_heads * d;
    const int64_t slices = num_kv_heads * weigh_slices(rows, d);
    memset(acc, 0, (size_t)(num_kv_heads * rows * d) * sizeof(float));
    for (int64_t t0 = 0; t0 < seq_len; t0 += SEQ_CHUNK) {
        const int64_t n = seq_len - t0 < SEQ_CHUNK ? seq_len - t0 : SEQ_CHUNK;
        const int64_t target = seq_len + t0 + SEQ_CHUNK + SEQ_AHEAD;
        const int64_t share = seq_fetch_share(fetch, target, slices);
        for (int64_t i = 0; i < n; i++)
            value[i] = cached_row(v_cache, offsets[t0 + i], cache_row, is_bf16,
                                  rows_f + i * cache_row);
        for (int64_t h = 0; h < num_kv_heads; h++)
            weigh_rows(acc + h * rows * d, weights + h * rows * stride + t0, stride, rows, value,
                       n, d, h * d, fetch, target, share);
        seq_fetch_to(fetch, target, INT64_MAX);
    }
}

/* Floats of scratch attend_sequence needs. */
static inline int64_t seq_scratch(int64_t num_new, int64_t num_heads, int64_t num_kv_heads,
                                  int64_t seq_len, int64_t d) {
    const int64_t all = num_new * num_heads, cache_row = num_kv_heads * d;
    const int64_t stride = (seq_len + TILE - 1) / TILE * TILE;
    return all * stride + 2 * all * d + TILE * cache_row + all + 1 + SEQ_CHUNK * cache_row +
           2 * seq_len + 2 * SEQ_CHUNK;
}

/* The first keys of a sequence of seq_len tokens that the sequence before it fetches. */
static inline int64_t seq_fetched_ahead(int64_t seq_len) {
    return seq_len < SEQ_AHEAD ? seq_len : SEQ_AHEAD;
}

/* A sequence's num_new new tokens (q's rows from first_row), every query head, by row: row
 * (j, g) of KV head h is token j's query head h * group + g and sees the first
 * seq_len - num_new + j + 1 keys. Its first `fetched` key rows were fetched already; the
 * first keys of the thread's next sequence (next_table, next_len; next_len 0: none) are
 * fetched at the end. scratch: seq_scratch(...) floats. */
static void attend_sequence(void *out, const void *q, int64_t q_row_stride, const void *k_cache,
                            const void *v_cache, const int32_t *table, int64_t seq_len,
                            int64_t first_row, int64_t num_new, int64_t num_heads,
                            int64_t num_kv_heads, int64_t d, int64_t block_size, float scale,
                            int is_bf16, int64_t fetched, const int32_t *next_table,
                            int64_t next_len, float *scratch) {
    const int64_t group = num_heads / num_kv_heads, rows = num_new * group;
    const int64_t all = rows * num_kv_heads, cache_row = num_kv_heads * d;
    const int64_t elem = is_bf16 ? 2 : 4;
    const int64_t stride = (seq_len + TILE - 1) / TILE * TILE;
    float *scores = scratch;
    float *acc = scores + all * stride;
    float *queries = acc + all * d;
    float *tile = queries + all * d;
    float *inv_sum = tile + TILE * cache_row;
    float *rows_f = inv_sum + all + (all & 1);
    int64_t *offsets = (int64_t *)(rows_f + SEQ_CHUNK * cache_row); /* 8-byte aligned */
    const float **value = (const float **)(offsets + seq_len);

    row_offsets(offsets, table, seq_len, block_size, cache_row, 0, d);
    seq_fetch fetch = {(const char *)k_cache, (const char *)v_cache, offsets, next_table,
                       seq_len, seq_fetched_ahead(next_len), block_size, cache_row, elem,
                       (cache_row * elem + 63) / 64, fetched, 0};
    for (int64_t h = 0; h < num_kv_heads; h++)
        for (int64_t r = 0; r < rows; r++)
            widen_row(queries + (h * rows + r) * d,
                      (const char *)q + ((first_row + r / group) * q_row_stride +
                                         (h * group + r % group) * d) * elem,
                      d, is_bf16);
    seq_score_keys(scores, stride, queries, rows, num_kv_heads, k_cache, offsets, seq_len, d,
                   scale, is_bf16, tile, &fetch);
    for (int64_t h = 0; h < num_kv_heads; h++)
        softmax_rows(scores + h * rows * stride, stride, rows, seq_len - num_new, group,
                     inv_sum + h * rows);
    seq_weigh_values(acc, scores, stride, rows, num_kv_heads, v_cache, offsets, seq_len, d,
                     is_bf16, rows_f, value, &fetch);
    for (int64_t h = 0; h < num_kv_heads; h++)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t j = r / group, head = h * group + r % group;
            char *dst = (char *)out + ((first_row + j) * num_heads + head) * d * elem;
            store_row(dst, acc + (h * rows + r) * d, inv_sum[h * rows + r], d, is_bf16);
        }
}

#endif
