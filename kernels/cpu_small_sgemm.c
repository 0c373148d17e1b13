/* y = x W^T (+ b) in float32 for a few dozen rows of x on the CPU: the linears of a decode
 * step (built with -mavx2 -mfma, or with AVX-512 where torch runs at AVX-512).
 *
 * With a few rows a decode step's linears stream their weights from memory, and with a few
 * dozen they are bound by multiply-adds. MKL's sgemm did neither well on a 2-core AMD EPYC
 * (SmolLM2-135M's linears and LM head, 16 rows: 82 ms by F.linear, 90 packed, where the
 * weights stream in ~35 ms). Here a weight is packed once into panels of NR output columns,
 * each panel's K x NR block contiguous by k, so a product streams every panel once, front to
 * back, while a tile of up to MR rows x NR columns accumulates in registers: per k, two
 * vector loads of the panel, one broadcast and two fused multiply-adds per row. Threads split
 * the panels. Many rows (a prompt) go in blocks that fit L2, each block over a thread's
 * panels in turn (the product's weight then comes from L3 after the first block).
 *
 * Every output is one chain of fused multiply-adds over k = 0, 1, ..., K - 1, whatever the row
 * count, the tile or the vector width: a row's outputs do not depend on the rows beside it.
 *
 * Layouts:
 *   w       [N, K] float32                 row-major, as a torch Linear's weight
 *   packed  [ceil(N / NR), K, NR] float32  small_sgemm_pack's output, zero-padded columns
 *   x       [M, K] float32                 row m at x + m * x_stride (elements)
 *   y       [M, N] float32                 row m at y + m * y_stride (elements)
 *   bias    [N] float32 or NULL
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu_exp.h"

#ifdef __AVX512F__
typedef __m512 vec;
#define LANES 16
#define MR 12 /* rows per tile: 24 accumulators + 2 panel vectors + 1 broadcast <= 32 */
#define vec_zero _mm512_setzero_ps
#define vec_load _mm512_loadu_ps
#define vec_store _mm512_storeu_ps
#define vec_broadcast _mm512_set1_ps
#define vec_fmadd _mm512_fmadd_ps
#define vec_add _mm512_add_ps
#else
typedef __m256 vec;
#define LANES 8
#define MR 6 /* rows per tile: 12 accumulators + 2 panel vectors + 1 broadcast <= 16 */
#define vec_zero _mm256_setzero_ps
#define vec_load _mm256_loadu_ps
#define vec_store _mm256_storeu_ps
#define vec_broadcast _mm256_set1_ps
#define vec_fmadd _mm256_fmadd_ps
#define vec_add _mm256_add_ps
#endif

#define NR (2 * LANES)              /* output columns per panel: two vectors */
#define PARALLEL_MIN_WORK (1 << 16) /* multiply-adds below which one thread does it all */
#define PREFETCH_BYTES 4096         /* how far ahead in the panel the stream is prefetched */
#define X_BLOCK_BYTES (256 * 1024)  /* rows of x a block holds (see block_rows) */

int64_t small_sgemm_max_tile_rows(void) { return MR; }

int64_t small_sgemm_panel_columns(void) { return NR; }

/* float32 elements a packed [n, k] weight takes. */
int64_t small_sgemm_packed_numel(int64_t n, int64_t k) { return (n + NR - 1) / NR * NR * k; }

void small_sgemm_pack(const float *restrict w, int64_t n, int64_t k, float *restrict packed) {
    const int64_t panels = (n + NR - 1) / NR;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        float *dst = packed + p * NR * k;
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = 0; j < NR; j++) {
                const int64_t row = p * NR + j;
                dst[kk * NR + j] = row < n ? w[row * k + kk] : 0.0f;
            }
    }
}

/* acc[r] = rows x[0..rows) times one panel, over all of k. `rows` is a constant wherever this
 * is inlined (see tile_product), so the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(const float *restrict x, int64_t x_stride,
                                                      const float *restrict panel, int64_t k,
                                                      const int rows, vec acc[MR][2]) {
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = vec_zero();
    for (int64_t kk = 0; kk < k; kk++) {
        const float *w = panel + kk * NR;
        __builtin_prefetch((const char *)w + PREFETCH_BYTES);
#ifndef __AVX512F__
        __builtin_prefetch((const char *)w + PREFETCH_BYTES + 32);
#endif
        const vec w0 = vec_load(w), w1 = vec_load(w + LANES);
        for (int r = 0; r < rows; r++) {
            const vec xr = vec_broadcast(x[r * x_stride + kk]);
            acc[r][0] = vec_fmadd(xr, w0, acc[r][0]);
            acc[r][1] = vec_fmadd(xr, w1, acc[r][1]);
        }
    }
}

#define TILE_CASE(R)                                                                        \
    case R:                                                                                 \
        tile(x, x_stride, panel, k, R, acc);                                                \
        break;

/* Always inlined, as in cpu_small_gemm.c: a call would keep `acc` behind a pointer. */
static inline __attribute__((always_inline)) void tile_product(
    const float *restrict x, int64_t x_stride, const float *restrict panel, int64_t k, int rows,
    vec acc[MR][2]) {
    switch (rows) {
        TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
#if MR > 6
        TILE_CASE(7) TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12)
#endif
    }
}

/* One output row of a panel (NR sums) plus the bias, its first `columns` stored. */
static inline void store_row(float *restrict out, vec lo, vec hi, const float *restrict bias,
                             int64_t columns) {
    if (columns == NR) {
        if (bias) {
            lo = vec_add(lo, vec_load(bias));
            hi = vec_add(hi, vec_load(bias + LANES));
        }
        vec_store(out, lo);
        vec_store(out + LANES, hi);
        return;
    }
    float sums[NR];
    vec_store(sums, lo);
    vec_store(sums + LANES, hi);
    for (int64_t j = 0; j < columns; j++) out[j] = bias ? sums[j] + bias[j] : sums[j];
}

/* Rows per block: a block's rows of x (block * K floats) stay in L2 while every panel of a
 * thread passes over them. Without blocks each panel read all of x again, from L3 once x
 * outgrew L2: at 2048 rows a row cost 9% more than at 512. A multiple of MR. */
static int64_t block_rows(int64_t k) {
    const int64_t rows = X_BLOCK_BYTES / ((int64_t)sizeof(float) * (k > 0 ? k : 1)) / MR * MR;
    return rows > MR ? rows : MR;
}

void small_sgemm(const float *restrict x, int64_t m, int64_t k, int64_t x_stride,
                 const float *restrict packed, int64_t n, const float *restrict bias,
                 float *restrict y, int64_t y_stride) {
    const int64_t panels = (n + NR - 1) / NR, block = block_rows(k);
#pragma omp parallel if (m * n * k >= PARALLEL_MIN_WORK)
    for (int64_t b0 = 0; b0 < m; b0 += block) {
        const int64_t b1 = m - b0 < block ? m : b0 + block;
#pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; p++) {
            const float *panel = packed + p * NR * k;
            const int64_t n0 = p * NR, columns = n - n0 < NR ? n - n0 : NR;
            for (int64_t m0 = b0; m0 < b1; m0 += MR) {
                const int rows = b1 - m0 < MR ? (int)(b1 - m0) : MR;
                vec acc[MR][2];
                tile_product(x + m0 * x_stride, x_stride, panel, k, rows, acc);
                for (int r = 0; r < rows; r++)
                    store_row(y + (m0 + r) * y_stride + n0, acc[r][0], acc[r][1],
                              bias ? bias + n0 : 0, columns);
            }
        }
    }
}

/* ---- SwiGLU: the gate and up products of an MLP and silu(gate) * up in one pass ----
 *
 * `packed` is small_sgemm_pack of the merged [2 * n_inter, k] weight, the gate's rows first,
 * the up's after (n_inter a multiple of NR, so gate panel p and up panel p + n_inter / NR
 * cover the same columns). A tile's gate and up sums are the merged product's (the same
 * chains over k), and only silu(gate) * up is stored: the [m, 2 * n_inter] product and the
 * two passes of torch's silu and multiplication over it are gone. silu(g) is g / (1 + exp(-g))
 * as torch computes it in float32, with exp of -|g| only (Cephes here, SLEEF there: a value may
 * differ from torch's in its last bit or two). */

typedef float sgemm_vf __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t sgemm_vi __attribute__((vector_size(LANES * sizeof(float))));
DEFINE_EXP_NONPOSITIVE(sgemm_exp_nonpositive, sgemm_vf, sgemm_vi) /* cpu_exp.h */

static inline int any_lane(sgemm_vi mask) {
#ifdef __AVX512F__
    return _mm512_test_epi32_mask((__m512i)mask, (__m512i)mask) != 0;
#else
    return _mm256_movemask_ps((__m256)mask) != 0;
#endif
}

static inline sgemm_vf select_lanes(sgemm_vi mask, sgemm_vf yes, sgemm_vf no) {
    return (sgemm_vf)(((sgemm_vi)yes & mask) | ((sgemm_vi)no & ~mask));
}

/* silu(x) = x / (1 + exp(-x)); for x < 0 it is x e / (1 + e), e = exp(x) (no overflow). Below
 * -87, where exp(x) leaves the normal floats (and cpu_exp.h returns 0), x e^x = (x e^(x + 8))
 * e^-8, which torch still gets as x / exp(-x); below -88.7228, where its exp(-x) overflows,
 * torch gets -0. */
static inline sgemm_vf silu(sgemm_vf x) {
    const sgemm_vf e = sgemm_exp_nonpositive((sgemm_vf)((sgemm_vi)x | INT32_MIN));
    sgemm_vf out = select_lanes(x < 0.0f, x * e, x) / (1.0f + e);
    const sgemm_vi deep = x < -87.0f;
    if (any_lane(deep)) {
        const sgemm_vf tail = x * sgemm_exp_nonpositive(x + 8.0f) * 3.3546262790251185e-4f;
        out = select_lanes(deep, tail, out);
        out = select_lanes(x < -88.72283935546875f, (sgemm_vf){0} - 0.0f, out);
    }
    return out;
}

void small_sgemm_swiglu(const float *restrict x, int64_t m, int64_t k, int64_t x_stride,
                        const float *restrict packed, int64_t n_inter, float *restrict y,
                        int64_t y_stride) {
    const int64_t panels = n_inter / NR, block = block_rows(k);
#pragma omp parallel if (2 * m * n_inter * k >= PARALLEL_MIN_WORK)
    for (int64_t b0 = 0; b0 < m; b0 += block) {
        const int64_t b1 = m - b0 < block ? m : b0 + block;
#pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; p++) {
            const float *gate_panel = packed + p * NR * k;
            const float *up_panel = packed + (p + panels) * NR * k;
            for (int64_t m0 = b0; m0 < b1; m0 += MR) {
                const int rows = b1 - m0 < MR ? (int)(b1 - m0) : MR;
                /* The gate's sums wait in the output (L1) while the up product runs, and
                 * silu comes after it: both tiles in registers would spill inside the k
                 * loop in the 16-register AVX2 build, and silu between the two products made
                 * the second one 2x slower there (its constants held registers). */
                vec acc[MR][2];
                float *out = y + m0 * y_stride + p * NR;
                tile_product(x + m0 * x_stride, x_stride, gate_panel, k, rows, acc);
                for (int r = 0; r < rows; r++) {
                    vec_store(out + r * y_stride, acc[r][0]);
                    vec_store(out + r * y_stride + LANES, acc[r][1]);
                }
                tile_product(x + m0 * x_stride, x_stride, up_panel, k, rows, acc);
                for (int r = 0; r < rows; r++) {
                    float *row = out + r * y_stride;
                    const sgemm_vf lo = silu((sgemm_vf)vec_load(row)) * (sgemm_vf)acc[r][0];
                    const sgemm_vf hi = silu((sgemm_vf)vec_load(row + LANES)) * (sgemm_vf)acc[r][1];
                    vec_store(row, (vec)lo);
                    vec_store(row + LANES, (vec)hi);
                }
            }
        }
    }
}
