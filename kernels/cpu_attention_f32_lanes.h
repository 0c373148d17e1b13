/* Prompt attention of a float32 cache: the rows of a long chunk in the 8 lanes of a vector,
 * included by kernels/cpu_paged_attention.c after its v8f, load8, store8 and exp8_nonpositive.
 *
 * A chunk of more than F32_LANES_MIN_NEW - 1 new tokens (a prompt's, not a decode's or a
 * verification's) has many rows a (sequence, KV head); scored by row (score_keys), each row
 * reads its whole context, visible or not, and each score is a sum across lanes. Here 16 rows
 * sit in the lanes of two v8f, as a GEMM's micro-kernel holds them, and every step is
 * lane-wise:
 *   1. scores: the 16 rows' queries are transposed once (qt[c]: dimension c of each row);
 *      F32_KEYS keys at a time, each key element broadcast from the cache against qt[c],
 *      8 accumulators (2 loads of qt and 4 broadcasts a dimension for 8 multiply-adds).
 *      Only the keys some row of the block sees are read: a prompt's early rows see few.
 *      Scores are kept key by key, [key][16 rows].
 *   2. softmax over keys, 16 rows at once: exact (max-subtracted, over each row's visible
 *      keys), the weights past a row's last key 0.
 *   3. P V: F32_ROW_GROUP rows by 16 dimensions a pass over the keys, each weight broadcast,
 *      two value loads shared by the rows (12 accumulators).
 * A row's sums run over the keys (scores: over the dimensions) in order, whatever rows share
 * its block: its result depends only on its own query and context. They are not score_keys's
 * sums, so a row gets other bits here than by row; only chunks SDPA took before come here.
 * Needs head_dim a multiple of 8 and at most F32_MAX_HEAD_DIM.
 */
#ifndef PAGEDSERVE_CPU_ATTENTION_F32_LANES_H
#define PAGEDSERVE_CPU_ATTENTION_F32_LANES_H

#include <stdint.h>

#define F32_LANES 16          /* query rows a block: two v8f */
#define F32_LANES_MIN_NEW 17  /* new tokens from which a float32 chunk goes through the lanes */
#define F32_KEYS 4            /* keys scored together */
#define F32_ROW_GROUP 6       /* rows weighed together: 6 x 2 accumulators of 8 dimensions */
#define F32_MAX_HEAD_DIM 256  /* the transposed queries, on the stack */
#define F32_PREFETCH_ROWS 16  /* tokens ahead whose key (scores) or value rows are fetched */

_Static_assert(F32_ROW_GROUP == 6, "f32_weigh's switch covers groups of 1 to 6 rows");

static inline int f32_lanes_support(int64_t d) { return d % 8 == 0 && d <= F32_MAX_HEAD_DIM; }

static inline v8f broadcast8(float x) { return (v8f){0} + x; }

/* scores[t * 16 + i] = scale * <query row i, key t> for t < keys, rows i < n (lanes past n:
 * 0). Keys past `keys` in the last group of F32_KEYS are computed on key 0 and not stored. */
static void f32_scores(float *scores, const float *const *query_rows, int64_t n,
                       const float *k_cache, const int64_t *offsets, int64_t keys, int64_t d,
                       float scale) {
    v8f qt[2 * F32_MAX_HEAD_DIM]; /* qt[2 c + h]: dimension c of rows 8 h .. 8 h + 7 */
    for (int64_t c = 0; c < d; c++) {
        float lanes[F32_LANES] = {0};
        for (int64_t i = 0; i < n; i++) lanes[i] = query_rows[i][c];
        qt[2 * c] = load8(lanes);
        qt[2 * c + 1] = load8(lanes + 8);
    }
    for (int64_t a = 0; a < F32_PREFETCH_ROWS && a < keys; a++)
        for (int64_t b = 0; b < d; b += 16) __builtin_prefetch(k_cache + offsets[a] + b);
    for (int64_t t0 = 0; t0 < keys; t0 += F32_KEYS) {
        for (int64_t a = t0 + F32_PREFETCH_ROWS; a < t0 + F32_PREFETCH_ROWS + F32_KEYS && a < keys;
             a++)
            for (int64_t b = 0; b < d; b += 16) __builtin_prefetch(k_cache + offsets[a] + b);
        const float *key[F32_KEYS];
        for (int k = 0; k < F32_KEYS; k++)
            key[k] = k_cache + offsets[t0 + k < keys ? t0 + k : 0];
        v8f lo[F32_KEYS] = {0}, hi[F32_KEYS] = {0};
        for (int64_t c = 0; c < d; c++) {
            const v8f q_lo = qt[2 * c], q_hi = qt[2 * c + 1];
            for (int k = 0; k < F32_KEYS; k++) {
                const v8f x = broadcast8(key[k][c]);
                lo[k] += q_lo * x;
                hi[k] += q_hi * x;
            }
        }
        for (int k = 0; k < F32_KEYS && t0 + k < keys; k++) {
            store8(scores + (t0 + k) * F32_LANES, lo[k] * scale);
            store8(scores + (t0 + k) * F32_LANES + 8, hi[k] * scale);
        }
    }
}

/* Each of the n rows' scores (scores[t * 16 + i], t < keys) becomes its unnormalized softmax
 * weight over the keys it sees (t <= last[i]), 0 past them; 1 / their sum goes to inv_sum[i]. */
static void f32_softmax(float *scores, const int64_t *last, int64_t n, int64_t keys,
                        float *inv_sum) {
    int32_t seen[F32_LANES]; /* lanes past n see key 0: finite, never stored */
    for (int64_t i = 0; i < F32_LANES; i++) seen[i] = i < n ? (int32_t)last[i] : 0;
    v8i last_v[2];
    memcpy(&last_v[0], seen, sizeof last_v[0]);
    memcpy(&last_v[1], seen + 8, sizeof last_v[1]);
    v8f max[2] = {(v8f){0} - INFINITY, (v8f){0} - INFINITY};
    for (int64_t t = 0; t < keys; t++)
        for (int h = 0; h < 2; h++) {
            const v8f s = load8(scores + t * F32_LANES + 8 * h);
            const v8i take = (s > max[h]) & ((v8i){0} + (int32_t)t <= last_v[h]);
            max[h] = (v8f)(((v8i)s & take) | ((v8i)max[h] & ~take));
        }
    v8f sum[2] = {{0}, {0}};
    for (int64_t t = 0; t < keys; t++)
        for (int h = 0; h < 2; h++) {
            const v8i visible = (v8i){0} + (int32_t)t <= last_v[h];
            const v8f e = (v8f)((v8i)exp8_nonpositive(load8(scores + t * F32_LANES + 8 * h) -
                                                       max[h]) &
                                visible);
            store8(scores + t * F32_LANES + 8 * h, e);
            sum[h] += e;
        }
    for (int64_t i = 0; i < n; i++) inv_sum[i] = 1.0f / sum[i / 8][i % 8];
}

/* acc[r * d + c ...] for ROWS rows from r = 0, 16 dimensions from c: the sum over t < keys
 * of weights[t * 16 + r] * value row t. */
#define F32_WEIGH(ROWS)                                                                       \
    static inline void f32_weigh_##ROWS(float *acc, int64_t d, const float *weights,          \
                                        const float *v_cache, const int64_t *offsets,         \
                                        int64_t keys, int64_t c) {                            \
        v8f a[ROWS][2] = {{0}};                                                               \
        for (int64_t t = 0; t < keys; t++) {                                                  \
            const float *v = v_cache + offsets[t] + c;                                        \
            const v8f x0 = load8(v), x1 = load8(v + 8);                                       \
            for (int r = 0; r < ROWS; r++) {                                                  \
                const v8f p = broadcast8(weights[t * F32_LANES + r]);                         \
                a[r][0] += p * x0;                                                            \
                a[r][1] += p * x1;                                                            \
            }                                                                                 \
        }                                                                                     \
        for (int r = 0; r < ROWS; r++) {                                                      \
            store8(acc + r * d + c, a[r][0]);                                                 \
            store8(acc + r * d + c + 8, a[r][1]);                                             \
        }                                                                                     \
    }
F32_WEIGH(1)
F32_WEIGH(2)
F32_WEIGH(3)
F32_WEIGH(4)
F32_WEIGH(5)
F32_WEIGH(6)

/* The same for 8 dimensions from c (head_dim an odd multiple of 8: its last 8), one row. */
static inline void f32_weigh_narrow(float *acc, const float *weights, const float *v_cache,
                                    const int64_t *offsets, int64_t keys, int64_t c) {
    v8f a = {0};
    for (int64_t t = 0; t < keys; t++) a += broadcast8(weights[t * F32_LANES]) *
                                            load8(v_cache + offsets[t] + c);
    store8(acc + c, a);
}

/* acc[i * d ...] = sum over t < keys of weights[t * 16 + i] * value row t, rows i < n. */
static void f32_weigh(float *acc, const float *weights, int64_t n, int64_t keys, int64_t d,
                      const float *v_cache, const int64_t *offsets) {
    for (int64_t a = 0; a < F32_PREFETCH_ROWS && a < keys; a++)
        for (int64_t b = 0; b < d; b += 16) __builtin_prefetch(v_cache + offsets[a] + b);
    for (int64_t r0 = 0; r0 < n; r0 += F32_ROW_GROUP) {
        const int64_t rows = n - r0 < F32_ROW_GROUP ? n - r0 : F32_ROW_GROUP;
        float *out = acc + r0 * d;
        const float *w = weights + r0;
        int64_t c = 0;
        for (; c + 16 <= d; c += 16) switch (rows) {
            case 1: f32_weigh_1(out, d, w, v_cache, offsets, keys, c); break;
            case 2: f32_weigh_2(out, d, w, v_cache, offsets, keys, c); break;
            case 3: f32_weigh_3(out, d, w, v_cache, offsets, keys, c); break;
            case 4: f32_weigh_4(out, d, w, v_cache, offsets, keys, c); break;
            case 5: f32_weigh_5(out, d, w, v_cache, offsets, keys, c); break;
            default: f32_weigh_6(out, d, w, v_cache, offsets, keys, c); break;
            }
        if (c < d)
            for (int64_t r = 0; r < rows; r++)
                f32_weigh_narrow(out + r * d, w + r, v_cache, offsets, keys, c);
    }
}

/* Rows i < n (n <= 16) of one (sequence, KV head) of a float32 cache: acc[i * d ...] gets row
 * i's unnormalized output and inv_sum[i] its normalizer. Row i sees keys t <= last[i]
 * (< seq_len); keys no row of the block sees are not read. scratch: seq_len * 16 floats. */
static void f32_attend_rows(float *acc, float *inv_sum, const float *const *query_rows,
                            const int64_t *last, int64_t n, const float *k_cache,
                            const float *v_cache, const int64_t *offsets, int64_t d,
                            float scale, float *scratch) {
    int64_t keys = 0;
    for (int64_t i = 0; i < n; i++) keys = last[i] + 1 > keys ? last[i] + 1 : keys;
    f32_scores(scratch, query_rows, n, k_cache, offsets, keys, d, scale);
    f32_softmax(scratch, last, n, keys, inv_sum);
    f32_weigh(acc, scratch, n, keys, d, v_cache, offsets);
}

#endif
