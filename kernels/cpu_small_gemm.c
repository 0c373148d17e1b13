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
 * the panels. Outputs are rounded to bf16 (nearest even, vcvtne2ps2bf16) once, after the bias
 * is added.
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

#include "cpu_exp.h"

#define NR 32 /* output columns per panel: two vectors of 16 floats */
#define MR 12 /* rows per tile: 24 accumulators + 2 panel vectors + 1 broadcast <= 32 */
#define PARALLEL_MIN_WORK (1 << 16) /* multiply-adds below which one thread does it all */
#define PREFETCH_PAIRS 64 /* k-pairs ahead the panel is prefetched (8 KB) */

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
        __builtin_prefetch(panel + (q + PREFETCH_PAIRS) * NR * 2);
        __builtin_prefetch(panel + (q + PREFETCH_PAIRS) * NR * 2 + 32);
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

/* Always inlined: a call would keep `acc` in memory, behind a pointer, through the whole k
 * loop (a separate function made every product ~3x slower once it had three callers). */
static inline __attribute__((always_inline)) void tile_product(
    const uint16_t *restrict x, int64_t x_stride, const uint16_t *restrict panel, int64_t k,
    int rows, __m512 acc[MR][2]) {
    switch (rows) {
        TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
        TILE_CASE(7) TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12)
    }
}

/* 16 bf16 values widened to float32 (bf16 is the top half of a float32). */
static inline __m512 widen16(const uint16_t *p) {
    const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

/* One output row of a panel: 32 float32 sums (lo: columns 0-15, hi: 16-31) plus the bias,
 * rounded to bf16 (nearest even), the first `columns` of them stored. */
static inline void store_row(uint16_t *out, __m512 lo, __m512 hi, const uint16_t *bias,
                             int64_t columns) {
    if (bias && columns == NR) {
        lo = _mm512_add_ps(lo, widen16(bias));
        hi = _mm512_add_ps(hi, widen16(bias + 16));
    } else if (bias) {
        uint16_t padded[NR] = {0};
        memcpy(padded, bias, (size_t)columns * sizeof(uint16_t));
        lo = _mm512_add_ps(lo, widen16(padded));
        hi = _mm512_add_ps(hi, widen16(padded + 16));
    }
    const __m512i rounded = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    if (columns == NR)
        _mm512_storeu_si512(out, rounded);
    else
        _mm512_mask_storeu_epi16(out, (__mmask32)((1ull << columns) - 1), rounded);
}

static void store_tile(uint16_t *restrict y, int64_t y_stride, int rows, int64_t columns,
                       const uint16_t *restrict bias, __m512 acc[MR][2]) {
    for (int r = 0; r < rows; r++) store_row(y + r * y_stride, acc[r][0], acc[r][1], bias, columns);
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

/* ---- SwiGLU: the gate and up products of an MLP and silu(gate) * up in one pass ----
 *
 * `packed` is small_gemm_pack of the merged [2 * n_inter, k] weight, the gate's rows first,
 * the up's after (n_inter a multiple of NR, so gate panel p and up panel p + n_inter / NR
 * cover the same 32 columns). Each tile of the gate product is kept (what the 32 registers do
 * not hold beside the up tile's sums spills to L1) while the up product of the same rows and
 * columns is computed, and only silu(gate) * up is stored:
 * the [m, 2 * n_inter] product, its split, silu and the multiplication no longer cost a
 * pass over memory and three torch calls each. The rounding is torch's on bf16 tensors:
 * gate and up rounded to bf16, silu computed in float32 (x / (1 + exp(-x))) and rounded,
 * the product of the two rounded values rounded again. Only silu's exp differs from torch's
 * (Cephes here, SLEEF there, each within 2 ulp), so a value a hair from a bf16 rounding
 * boundary may round the other way. */

typedef float swiglu_v16f __attribute__((vector_size(64)));
typedef int32_t swiglu_v16i __attribute__((vector_size(64)));
DEFINE_EXP_NONPOSITIVE(swiglu_exp_nonpositive, swiglu_v16f, swiglu_v16i) /* cpu_exp.h */

/* float32 values rounded to bf16 (nearest even) and widened back. */
static inline __m512 round_to_bf16(__m512 v) {
    const __m256i bits = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

/* silu(x) = x / (1 + exp(-x)) in float32 as torch computes it, with exp only of -|x| (no
 * overflow): for x < 0 it is x e / (1 + e), e = exp(x). Below -87, where exp(x) leaves the
 * normal floats (and cpu_exp.h returns 0), x e^x = (x e^(x + 8)) e^-8, which torch still gets
 * as x / exp(-x); below -88.7228, where its exp(-x) overflows, torch gets -0. */
static inline __m512 silu16(__m512 x) {
    const swiglu_v16f v = (swiglu_v16f)x;
    const swiglu_v16f e = swiglu_exp_nonpositive((swiglu_v16f)((swiglu_v16i)v | INT32_MIN));
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 negative = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);
    const __m512 numerator = _mm512_mask_mul_ps(x, negative, x, (__m512)e);
    __m512 silu = _mm512_div_ps(numerator, (__m512)(1.0f + e));
    const __mmask16 deep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    if (deep) {
        const __m512 shifted = (__m512)swiglu_exp_nonpositive(v + 8.0f);
        const __m512 e_minus_8 = _mm512_set1_ps(3.3546262790251185e-4f);
        const __m512 tail = _mm512_mul_ps(_mm512_mul_ps(x, shifted), e_minus_8);
        silu = _mm512_mask_mov_ps(silu, deep, tail);
        const __m512 overflow_below = _mm512_set1_ps(-88.72283935546875f);
        const __mmask16 overflow = _mm512_cmp_ps_mask(x, overflow_below, _CMP_LT_OQ);
        silu = _mm512_mask_mov_ps(silu, overflow, _mm512_set1_ps(-0.0f));
    }
    return silu;
}

static inline __m512 swiglu16(__m512 gate, __m512 up) {
    const __m512 silu = round_to_bf16(silu16(round_to_bf16(gate)));
    return _mm512_mul_ps(silu, round_to_bf16(up));
}

void small_gemm_swiglu(const uint16_t *restrict x, int64_t m, int64_t k, int64_t x_stride,
                       const uint16_t *restrict packed, int64_t n_inter, uint16_t *restrict y,
                       int64_t y_stride) {
    const int64_t panels = n_inter / NR, panel_size = NR * ((k + 1) / 2 * 2);
#pragma omp parallel for schedule(static) if (2 * m * n_inter * k >= PARALLEL_MIN_WORK)
    for (int64_t p = 0; p < panels; p++) {
        const uint16_t *gate_panel = packed + p * panel_size;
        const uint16_t *up_panel = packed + (p + panels) * panel_size;
        for (int64_t m0 = 0; m0 < m; m0 += MR) {
            const int rows = m - m0 < MR ? (int)(m - m0) : MR;
            __m512 gate[MR][2], up[MR][2];
            tile_product(x + m0 * x_stride, x_stride, gate_panel, k, rows, gate);
            tile_product(x + m0 * x_stride, x_stride, up_panel, k, rows, up);
            for (int r = 0; r < rows; r++) {
                const __m512 lo = swiglu16(gate[r][0], up[r][0]);
                const __m512 hi = swiglu16(gate[r][1], up[r][1]);
                _mm512_storeu_si512(y + (m0 + r) * y_stride + p * NR,
                                    (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            }
        }
    }
}

/* silu(gate) * up of rows already multiplied: x holds each row's gate (n_inter columns) and
 * then its up (n_inter more), both bf16, as the merged gate-and-up product leaves them. The
 * values and roundings are small_gemm_swiglu's (the product's bf16 outputs are the values it
 * rounds gate and up to), so the two forms give the same bits. For CPUs whose AMX product is
 * faster than the fused pass: the product there, this after it. n_inter a multiple of 16. */
void silu_and_mul(const uint16_t *restrict x, int64_t m, int64_t n_inter, int64_t x_stride,
                  uint16_t *restrict y, int64_t y_stride) {
#pragma omp parallel for schedule(static) if (m * n_inter >= PARALLEL_MIN_WORK)
    for (int64_t r = 0; r < m; r++) {
        const uint16_t *gate = x + r * x_stride, *up = gate + n_inter;
        for (int64_t j = 0; j < n_inter; j += 16) {
            const __m512 product = swiglu16(widen16(gate + j), widen16(up + j));
            _mm256_storeu_si256((__m256i *)(y + r * y_stride + j),
                                (__m256i)_mm512_cvtneps_pbh(product));
        }
    }
}

/* ---- AMX: the same product on tiles, for CPUs with AMX-BF16 (built with -mamx-tile
 * -mamx-bf16) ----
 *
 * Past a dozen rows the vdpbf16ps tile above is compute-bound. AMX multiplies a 16-row x 32-k
 * tile of x by a 32-k x 16-column tile of the weight in one instruction, so up to 32 rows
 * cost about what one does: the weight's stream again. The panels need no other packing: a
 * panel's k-pair rows are its 32 columns' pairs, 128 bytes, so the weight tile of columns
 * 0-15 (16-31) for 16 k-pairs is 16 rows of 64 bytes, 128 bytes apart. K must be a multiple
 * of 32 (callers check). Tiles:
 *   0, 1  accumulators, rows 0-15 x columns 0-15 / 16-31     4  x rows 0-15
 *   2, 3  accumulators, rows 16-31                           5  x rows 16-31
 *   6, 7  weight, columns 0-15 / 16-31
 */
#if (defined(__AMX_TILE__) && defined(__AMX_BF16__)) || defined(PAGEDSERVE_AMX_EMULATION)
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_ROWS 16
#define PREFETCH_STEPS 4

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Asks Linux for the AMX tile state (once per process); 0 when granted. The tests' software
 * tiles (tests/kernels/amx_emulation.h, on CPUs without AMX) need no state of Linux's. */
int small_gemm_amx_init(void) {
#ifdef PAGEDSERVE_AMX_EMULATION
    return 0;
#else
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
#endif
}

static void configure(int rows0, int rows1) {
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette_id = 1;
    const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
    for (int t = 0; t < 8; t++) {
        config.rows[t] = (uint8_t)rows[t];
        config.colsb[t] = rows[t] ? 64 : 0;
    }
    _tile_loadconfig(&config);
}

/* Rows [m0, m0 + rows0 + rows1) of x times one panel into `out` [32][NR] float32. */
static void amx_block(const uint16_t *x, int64_t x_stride, const uint16_t *panel, int64_t k,
                      int rows1, float *out) {
    const size_t x_bytes = (size_t)x_stride * 2;
    _tile_zero(0);
    _tile_zero(1);
    if (rows1) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t kk = 0; kk < k; kk += 32) {
        const uint16_t *weight = panel + kk * NR; /* k-pair kk / 2, 2 * NR elements per pair */
        /* Tile loads wait on memory where vector loads are prefetched by the hardware: ask
         * for the weight tiles PREFETCH_STEPS steps ahead (2.2 KB a step; 1 row, 2 cores:
         * SmolLM2-135M's linears 35 -> 21 ms, at memory speed). */
        for (int line = 0; line < 2 * NR * 2 * 16 / 64; line++)
            __builtin_prefetch((const char *)(weight + PREFETCH_STEPS * 32 * NR) + 64 * line);
        _tile_loadd(6, weight, 2 * NR * 2);
        _tile_loadd(7, weight + 32, 2 * NR * 2);
        _tile_loadd(4, x + kk, x_bytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (rows1) {
            _tile_loadd(5, x + AMX_ROWS * x_stride + kk, x_bytes);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, out, NR * 4);
    _tile_stored(1, out + 16, NR * 4);
    if (rows1) {
        _tile_stored(2, out + AMX_ROWS * NR, NR * 4);
        _tile_stored(3, out + AMX_ROWS * NR + 16, NR * 4);
    }
}

static void store_rows(uint16_t *restrict y, int64_t y_stride, int rows, int64_t columns,
                       const uint16_t *restrict bias, const float *restrict block) {
    for (int r = 0; r < rows; r++)
        store_row(y + r * y_stride, _mm512_loadu_ps(block + r * NR),
                  _mm512_loadu_ps(block + r * NR + 16), bias, columns);
}

void small_gemm_amx(const uint16_t *restrict x, int64_t m, int64_t k, int64_t x_stride,
                    const uint16_t *restrict packed, int64_t n, const uint16_t *restrict bias,
                    uint16_t *restrict y, int64_t y_stride) {
    const int64_t panels = (n + NR - 1) / NR, panel_size = NR * k;
#pragma omp parallel
    {
        float block[2 * AMX_ROWS * NR];
        int configured0 = -1, configured1 = -1;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t n0 = p * NR, columns = n - n0 < NR ? n - n0 : NR;
            for (int64_t m0 = 0; m0 < m; m0 += 2 * AMX_ROWS) {
                const int64_t left = m - m0;
                const int rows0 = left < AMX_ROWS ? (int)left : AMX_ROWS;
                const int rows1 = left - rows0 < AMX_ROWS ? (int)(left - rows0) : AMX_ROWS;
                if (rows0 != configured0 || rows1 != configured1) {
                    configure(rows0, rows1);
                    configured0 = rows0;
                    configured1 = rows1;
                }
                amx_block(x + m0 * x_stride, x_stride, packed + p * panel_size, k, rows1, block);
                store_rows(y + m0 * y_stride + n0, y_stride, rows0 + rows1, columns,
                           bias ? bias + n0 : 0, block);
            }
        }
        if (configured0 >= 0) _tile_release();
    }
}
#else
int small_gemm_amx_init(void) { return -1; } /* built without AMX */
void small_gemm_amx(const uint16_t *x, int64_t m, int64_t k, int64_t x_stride,
                    const uint16_t *packed, int64_t n, const uint16_t *bias, uint16_t *y,
                    int64_t y_stride) {
    (void)x, (void)m, (void)k, (void)x_stride, (void)packed, (void)n, (void)bias, (void)y,
        (void)y_stride;
}
#endif
