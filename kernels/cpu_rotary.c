/* Rotary position embedding applied in place on the CPU, for a layer's queries and keys at
 * once: one call where torch ran about ten small ops per layer (split, four products, a sum,
 * a difference, a concatenation, two casts).
 *
 * The arithmetic is Hugging Face Llama's "rotate half" convention, in float32 and op for op
 * (products and sums rounded separately: no fused multiply-add), so float32 results are
 * bit-identical to the torch path:
 *   x1, x2 = x[:D/2], x[D/2:]
 *   x[:D/2] = x1 * cos - x2 * sin;   x[D/2:] = x2 * cos + x1 * sin
 * bf16 values are widened, rotated in float32 and rounded back to bf16 (nearest even).
 *
 * Layouts: x [T, H, D] with rows (tokens) `row_stride` elements apart and heads contiguous
 * within a row; cos, sin [T, D/2] float32, contiguous. dtype: 0 float32, 1 bfloat16.
 */
#include <stdint.h>
#include <string.h>

#include "cpu_bf16.h"

#define PARALLEL_MIN_ELEMENTS (1 << 18)

__attribute__((optimize("fp-contract=off"))) static inline void rotate_f32(
    float *restrict x, const float *restrict cos, const float *restrict sin, int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const float x1 = x[i], x2 = x[half + i];
        const float a = x1 * cos[i], b = x2 * sin[i], c = x2 * cos[i], d = x1 * sin[i];
        x[i] = a - b;
        x[half + i] = c + d;
    }
}

__attribute__((optimize("fp-contract=off"))) static inline void rotate_bf16(
    uint16_t *restrict x, const float *restrict cos, const float *restrict sin, int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const float x1 = bf16_to_float(x[i]), x2 = bf16_to_float(x[half + i]);
        const float a = x1 * cos[i], b = x2 * sin[i], c = x2 * cos[i], d = x1 * sin[i];
        x[i] = float_to_bf16(a - b);
        x[half + i] = float_to_bf16(c + d);
    }
}

void rotate_in_place(void *x, int64_t tokens, int64_t heads, int64_t head_dim,
                     int64_t row_stride, const float *cos, const float *sin, int is_bf16) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t offset = t * row_stride + h * head_dim;
            if (is_bf16)
                rotate_bf16((uint16_t *)x + offset, cos + t * half, sin + t * half, half);
            else
                rotate_f32((float *)x + offset, cos + t * half, sin + t * half, half);
        }
}
