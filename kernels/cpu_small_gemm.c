/* y = x W^T (+ b) in bf16 for a few rows of x on the CPU: the linears of a decode step, on
 * CPUs with AVX512-BF16 (built with -mavx512f -mavx512bf16; the loader only builds it there).
 *
 * With a few rows, a decode step's linears are bound by streaming the weights from memory.
 * oneDNN's packed bf16 product took ~38 ms for SmolLM2-135M's linears at 1 to 12 rows on 2
 * cores, where the 212 MB of weights stream in ~14 ms. Here a weight is packed once into
 * panels of NR = 32 output columns, each panel's K x 32 block contiguous in pairs of k (the
 * operand layout of `vdpbf16ps`), so a product streams every panel once, front to back, while
 * a tile of up to MR rows x 32 columns accumulates in float32 registers: per pair of k, two
 * 64-byte loads of the panel, one broadcast per row and two `vdpbf16ps` per row. Threads split
 * the panels. Outputs are rounded to bf16 (nearest even) once, after the bias is added.
 *
 * Layouts:
 *   w       [N, K] bf16                  row-major, as a torch Linear's weight
 *   packed  [ceil(N / 32), ceil(K / 2), 32, 2] bf16   small_gemm_pack's output, zero-padded
 *   x       [M, K] bf16                  row m at x + m * x_stride (elements)
 *   y       [M, N] bf16                  row m at y + m * y_stride (elements)
 *   bias    [N] bf16 or NULL
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define NR 32 /* output columns per panel: two vectors of 16 floats */
#define MR 12 /* rows per tile: 24 accumulators + 2 panel vectors + 1 broadcast <= 32 */
#define PARALLEL_MIN_WORK (1 << 16) /* multiply-adds below which one thread does it all */

int64_t small_gemm_max_tile_rows(void) { return MR; }

/* bf16 elements a packed [n, k] weight takes. */
int64_t small_gemm_packed_numel(int64_t n, int64_t k) {
    return (n + NR - 1) / NR * NR * ((k + 1) / 2 * 2);
}

void small_gemm_pack(const uint16_t *restrict w, int64_t n, int64_t k,
                     uint16_t *restrict packed) {
    const int64_t panels = (n + NR - 1) / NR, pairs = (k + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        uint16_t *dst = packed + p * NR * pairs * 2;
        for (int64_t q = 0; q < pairs; q++)
            for (int64_t j = 0; j < NR; j++)
                for (int64_t h = 0; h < 2; h++) {
                    const int64_t row = p * NR + j, col = 2 * q + h;
                    dst[(q * NR + j) * 2 + h] = row < n && col < k ? w[row * k + col] : 0;
                }
    }
}

/* The pair x[2q], x[2q + 1] as one 32-bit lane, in every lane (the last k of an odd K pairs
 * with a zero). */
static inline __m512bh broadcast_pair(const uint16_t *x, int64_t q, int64_t k) {
    uint32_t pair;
    if (2 * q + 1 < k)
        memcpy(&pair, x + 2 * q, sizeof pair);
    else
        pair = x[2 * q];
    return (__m512bh)_mm512_set1_epi32((int)pair);
}

/* acc[r] = rows x[0..rows) times one panel, over all of k. `rows` is a constant wherever this
 * is inlined (see tile_product), so the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(const uint16_t *restrict x,
                                                      int64_t x_stride,
                                                      const uint16_t *restrict panel, int64_t k,
                                                      const int rows, __m512 acc[MR][2]) {
    const int64_t pairs = (k + 1) / 2, full_pairs = k / 2;
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t q = 0; q < full_pairs; q++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + q * NR * 2);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + q * NR * 2 + 32);
        for (int r = 0; r < rows; r++) {
            uint32_t pair;
            memcpy(&pair, x + r * x_stride + 2 * q, sizeof pair);
            const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
        }
    }
    for (int64_t q = full_pairs; q < pairs; q++) { /* odd K: the last k alone */
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + q * NR * 2);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + q * NR * 2 + 32);
        for (int r = 0; r < rows; r++) {
            const __m512bh xr = broadcast_pair(x + r * x_stride, q, k);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
        }
    }
}

#define TILE_CASE(R)                                                                        \
    case R:                                                                                 \
        tile(x, x_stride, panel, k, R, acc);                                                \
        break;

static void tile_product(const uint16_t *restrict x, int64_t x_stride,
                         const uint16_t *restrict panel, int64_t k, int rows, __m512 acc[MR][2]) {
    switch (rows) {
        TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
        TILE_CASE(7) TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12)
    }
}

static inline float bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static void store_tile(uint16_t *restrict y, int64_t y_stride, int rows, int64_t columns,
                       const uint16_t *restrict bias, __m512 acc[MR][2]) {
    for (int r = 0; r < rows; r++) {
        float row[NR];
        _mm512_storeu_ps(row, acc[r][0]);
        _mm512_storeu_ps(row + 16, acc[r][1]);
        uint16_t *out = y + r * y_stride;
        for (int64_t j = 0; j < columns; j++)
            out[j] = float_to_bf16(bias ? row[j] + bf16_to_float(bias[j]) : row[j]);
    }
}

void small_gemm(const uint16_t *restrict x, int64_t m, int64_t k, int64_t x_stride,
                const uint16_t *restrict packed, int64_t n, const uint16_t *restrict bias,
                uint16_t *restrict y, int64_t y_stride) {
    const int64_t panels = (n + NR - 1) / NR, panel_size = NR * ((k + 1) / 2 * 2);
#pragma omp parallel for schedule(static) if (m * n * k >= PARALLEL_MIN_WORK)
    for (int64_t p = 0; p < panels; p++) {
        const uint16_t *panel = packed + p * panel_size;
        const int64_t n0 = p * NR, columns = n - n0 < NR ? n - n0 : NR;
        for (int64_t m0 = 0; m0 < m; m0 += MR) {
            const int rows = m - m0 < MR ? (int)(m - m0) : MR;
            __m512 acc[MR][2];
            tile_product(x + m0 * x_stride, x_stride, panel, k, rows, acc);
            store_tile(y + m0 * y_stride + n0, y_stride, rows, columns, bias ? bias + n0 : 0,
                       acc);
        }
    }
}
