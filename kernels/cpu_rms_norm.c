/* RMSNorm with the residual add before it, in one pass, on the CPU.
 *
 * A decoder layer runs two of these; a decode step at small batch ran each as five to seven
 * torch ops (add, pow, mean, add, rsqrt, two muls) of a few microseconds' work and tens of
 * microseconds' dispatch: 137 us a call, 8 ms of a 12-sequence step on 2 AVX2 cores.
 *
 * The arithmetic is Hugging Face Llama's, op for op, in float32:
 *   sum = x + residual                 (rounded to the dtype: bf16 adds round to bf16)
 *   r   = 1 / sqrt(mean(sum^2) + eps)
 *   out = weight * dtype(sum * r)      (bf16: the product rounded, then times the weight and
 *                                       rounded again, as `weight * hidden.to(bf16)`)
 * The mean's sum is taken 8 lanes at a time, as torch's vectorized reduction does, in
 * another order: results agree with torch to float rounding.
 *
 * Layouts: x, residual, sum_out, out [rows, hidden], row-major, contiguous; weight [hidden]
 * in the same dtype. residual may be NULL (no add; sum_out is then not written). dtype: 0
 * float32, 1 bfloat16.
 *
 * `rms_norm_add` is the other order, a post-norm layer's (OLMo 2, EXAONE 4: the norm after
 * the branch, then the residual add): out = residual + RMSNorm(x) * weight, the norm as above
 * without an add, the sum rounded to the dtype, as the modules' `hidden + norm(branch)`.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_bf16.h"

#define LANES 8
#define PARALLEL_MIN_ELEMENTS (1 << 14) /* 64 x 576 bf16 rows, 2 Zen 5 threads: 24.6 -> 17.0 us */
#define MAX_ROW (1 << 14) /* the row buffers' elements: the widest row (or head) a call takes */

static inline float load(const void *p, int64_t i, int is_bf16) {
    return is_bf16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The value rounded to the dtype, as float. */
static inline float rounded(float v, int is_bf16) {
    return is_bf16 ? bf16_to_float(float_to_bf16(v)) : v;
}

static inline void store(void *p, int64_t i, float v, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)p)[i] = float_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

typedef float v8f __attribute__((vector_size(LANES * sizeof(float))));

/* One row; is_bf16 is a constant wherever this is inlined, so each loop vectorizes. */
static inline __attribute__((always_inline)) void norm_row(
    const void *restrict x, const void *restrict residual, void *restrict sum_out,
    void *restrict out, const void *restrict weight, int64_t hidden, float eps,
    const int is_bf16, float *restrict sum) {
    for (int64_t i = 0; i < hidden; i++) {
        const float v = load(x, i, is_bf16);
        sum[i] = residual ? rounded(v + load(residual, i, is_bf16), is_bf16) : v;
    }
    v8f lanes = {0};
    int64_t i = 0;
    for (; i + LANES <= hidden; i += LANES) {
        v8f v;
        memcpy(&v, sum + i, sizeof v);
        lanes += v * v;
    }
    float total = 0.0f;
    for (int l = 0; l < LANES; l++) total += lanes[l];
    for (; i < hidden; i++) total += sum[i] * sum[i];
    const float r = 1.0f / sqrtf(total / (float)hidden + eps);
    if (residual)
        for (int64_t j = 0; j < hidden; j++) store(sum_out, j, sum[j], is_bf16);
    for (int64_t j = 0; j < hidden; j++)
        store(out, j, load(weight, j, is_bf16) * rounded(sum[j] * r, is_bf16), is_bf16);
}

/* Returns 0, or -1 if hidden is too large for the row buffer. */
int add_rms_norm(const void *x, const void *residual, void *sum_out, void *out,
                 const void *weight, int64_t rows, int64_t hidden, float eps, int is_bf16) {
    if (hidden > MAX_ROW) return -1;
    const int64_t element = is_bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * hidden >= PARALLEL_MIN_ELEMENTS)
    for (int64_t row = 0; row < rows; row++) {
        float sum[MAX_ROW];
        const int64_t offset = row * hidden * element;
        const void *x_row = (const char *)x + offset;
        const void *residual_row = residual ? (const char *)residual + offset : 0;
        void *sum_row = (char *)sum_out + offset, *out_row = (char *)out + offset;
        if (is_bf16)
            norm_row(x_row, residual_row, sum_row, out_row, weight, hidden, eps, 1, sum);
        else
            norm_row(x_row, residual_row, sum_row, out_row, weight, hidden, eps, 0, sum);
    }
    return 0;
}

/* One row of rms_norm_add; is_bf16 a constant where inlined, as in norm_row. */
static inline __attribute__((always_inline)) void norm_add_row(
    const void *x, const void *residual, void *out, const void *weight, int64_t hidden,
    float eps, const int is_bf16, float *restrict sum, void *restrict normed) {
    norm_row(x, 0, 0, normed, weight, hidden, eps, is_bf16, sum);
    for (int64_t j = 0; j < hidden; j++)
        store(out, j, load(residual, j, is_bf16) + load(normed, j, is_bf16), is_bf16);
}

/* residual + RMSNorm(x) * weight, row by row (see the top); out may be residual itself.
 * Returns 0, or -1 if hidden is too large for the row buffer. */
int rms_norm_add(const void *x, const void *residual, void *out, const void *weight,
                 int64_t rows, int64_t hidden, float eps, int is_bf16) {
    if (hidden > MAX_ROW) return -1;
    const int64_t element = is_bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * hidden >= PARALLEL_MIN_ELEMENTS)
    for (int64_t row = 0; row < rows; row++) {
        float sum[MAX_ROW];
        char normed[MAX_ROW * 4];
        const int64_t offset = row * hidden * element;
        const void *x_row = (const char *)x + offset;
        const void *residual_row = (const char *)residual + offset;
        void *out_row = (char *)out + offset;
        if (is_bf16)
            norm_add_row(x_row, residual_row, out_row, weight, hidden, eps, 1, sum, normed);
        else
            norm_add_row(x_row, residual_row, out_row, weight, hidden, eps, 0, sum, normed);
    }
    return 0;
}

/* RMSNorm of each head of strided rows, in place: `rows` rows `row_stride` elements apart,
 * each starting with `heads` heads of `head_dim` elements (a qkv product's query or key heads,
 * as Qwen3 norms them before the rotary embedding; OLMo 2 norms the whole projection, one
 * "head" of every head's width), each head normed with one weight [head_dim] as add_rms_norm
 * norms a row without residual, so the bits are the same as add_rms_norm's on a contiguous
 * copy of the heads. Returns 0, or -1 if head_dim is too large for the row buffer. */
int rms_norm_heads(void *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
                   const void *weight, float eps, int is_bf16) {
    if (head_dim > MAX_ROW) return -1;
    const int64_t element = is_bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * heads * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t i = 0; i < rows * heads; i++) {
        float sum[MAX_ROW];
        char copy[MAX_ROW * 4]; /* the head's input: norm_row's x and out must not alias */
        char *head = (char *)x + ((i / heads) * row_stride + (i % heads) * head_dim) * element;
        memcpy(copy, head, (size_t)(head_dim * element));
        if (is_bf16)
            norm_row(copy, 0, 0, head, weight, head_dim, eps, 1, sum);
        else
            norm_row(copy, 0, 0, head, weight, head_dim, eps, 0, sum);
    }
    return 0;
}
