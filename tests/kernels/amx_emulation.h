/* AMX-BF16 in software, for testing the AMX code of kernels/cpu_small_gemm.c on CPUs without
 * AMX. Force-included (`-include amx_emulation.h -DPAGEDSERVE_AMX_EMULATION`) ahead of the
 * source: it replaces the intrinsics the kernel calls (_tile_loadconfig, _tile_release,
 * _tile_zero, _tile_loadd, _tile_stored, _tile_dpbf16ps) with functions that follow the
 * instructions' pseudo-code in Intel's manual (palette 1: 8 tiles of up to 16 rows of 64
 * bytes, per thread) and check what the hardware checks: a configuration the CPU would refuse
 * (#GP), or an instruction on tiles that are not configured or whose shapes do not fit (#UD).
 * The first such fault is kept in `amx_emulation_fault` (a message; `amx_emulation_faulted` is
 * 1 once there is one) and the faulting instruction is skipped, so a test reads why rather than losing the process.
 * `amx_emulation_products` counts the tile products, to show the tiles were used.
 *
 * Arithmetic as TDPBF16PS's pseudo-code: per output, for each pair of k, the even product and
 * then the odd one added to a float32 accumulator (nearest even), denormal inputs read as zero
 * and denormal results flushed to zero. The hardware's own order of additions inside a pair
 * is not documented further, so the bits of real tiles may differ in the last place; tests
 * compare with exact products to bf16 rounding, as they do on AMX CPUs. */
#ifndef PAGEDSERVE_AMX_EMULATION_H
#define PAGEDSERVE_AMX_EMULATION_H

#include <immintrin.h> /* first, so that its own _tile_* definitions are replaced below */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define AMX_EMU_TILES 8
#define AMX_EMU_MAX_ROWS 16
#define AMX_EMU_ROW_BYTES 64

typedef struct {
    int configured;
    uint8_t rows[AMX_EMU_TILES];
    uint16_t colsb[AMX_EMU_TILES];
    _Alignas(64) uint8_t data[AMX_EMU_TILES][AMX_EMU_MAX_ROWS][AMX_EMU_ROW_BYTES];
} amx_emu_state;

static __thread amx_emu_state amx_emu;

char amx_emulation_fault[256];
int amx_emulation_faulted; /* 1 once amx_emulation_fault holds a message (tests clear both) */
int64_t amx_emulation_products;

static void amx_emu_fault(const char *what, int tile) {
    /* the first fault of any thread is kept */
    if (__atomic_exchange_n(&amx_emulation_faulted, 1, __ATOMIC_SEQ_CST) == 0)
        snprintf(amx_emulation_fault, sizeof amx_emulation_fault, "%s (tile %d)", what, tile);
}

/* LDTILECFG: palette 0 releases; palette 1 takes rows <= 16 and colsb <= 64 for tiles 0-7,
 * both zero (unused) or both set, and zeros everywhere else in the 64 bytes. */
static void amx_emu_loadconfig(const void *config) {
    const uint8_t *bytes = (const uint8_t *)config;
    if (bytes[0] == 0) {
        memset(&amx_emu, 0, sizeof amx_emu);
        return;
    }
    if (bytes[0] != 1) {
        amx_emu_fault("LDTILECFG: palette other than 0 or 1 (#GP)", -1);
        return;
    }
    for (int i = 1; i < 16; i++)
        if (bytes[i]) {
            amx_emu_fault("LDTILECFG: start_row or a reserved byte is not zero (#GP)", -1);
            return;
        }
    for (int t = 0; t < 16; t++) {
        uint16_t colsb;
        memcpy(&colsb, bytes + 16 + 2 * t, 2);
        const uint8_t rows = bytes[48 + t];
        if (t >= AMX_EMU_TILES ? (rows || colsb)
                               : (rows > AMX_EMU_MAX_ROWS || colsb > AMX_EMU_ROW_BYTES ||
                                  (rows == 0) != (colsb == 0))) {
            amx_emu_fault("LDTILECFG: a tile's rows or bytes per row out of range (#GP)", t);
            return;
        }
    }
    memset(&amx_emu, 0, sizeof amx_emu);
    amx_emu.configured = 1;
    for (int t = 0; t < AMX_EMU_TILES; t++) {
        amx_emu.rows[t] = bytes[48 + t];
        memcpy(&amx_emu.colsb[t], bytes + 16 + 2 * t, 2);
    }
}

static void amx_emu_release(void) { memset(&amx_emu, 0, sizeof amx_emu); }

/* A tile an instruction may name: configured and in use. */
static int amx_emu_usable(int tile, const char *instruction) {
    if (amx_emu.configured && tile >= 0 && tile < AMX_EMU_TILES && amx_emu.rows[tile]) return 1;
    amx_emu_fault(instruction, tile);
    return 0;
}

static void amx_emu_zero(int tile) {
    if (!amx_emu_usable(tile, "TILEZERO: tiles not configured, or this one unused (#UD)")) return;
    memset(amx_emu.data[tile], 0, sizeof amx_emu.data[tile]);
}

static void amx_emu_loadd(int tile, const void *base, size_t stride) {
    if (!amx_emu_usable(tile, "TILELOADD: tiles not configured, or this one unused (#UD)")) return;
    memset(amx_emu.data[tile], 0, sizeof amx_emu.data[tile]);
    for (int r = 0; r < amx_emu.rows[tile]; r++)
        memcpy(amx_emu.data[tile][r], (const char *)base + r * stride, amx_emu.colsb[tile]);
}

static void amx_emu_stored(int tile, void *base, size_t stride) {
    if (!amx_emu_usable(tile, "TILESTORED: tiles not configured, or this one unused (#UD)"))
        return;
    for (int r = 0; r < amx_emu.rows[tile]; r++)
        memcpy((char *)base + r * stride, amx_emu.data[tile][r], amx_emu.colsb[tile]);
}

static inline float amx_emu_bf16(uint16_t bits) {
    const uint32_t wide = (bits & 0x7f80) ? (uint32_t)bits << 16 : (uint32_t)(bits & 0x8000) << 16;
    float value;
    memcpy(&value, &wide, 4);
    return value; /* a denormal reads as a zero of its sign (DAZ) */
}

static inline float amx_emu_flush(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u; /* FTZ */
    memcpy(&value, &bits, 4);
    return value;
}

/* TDPBF16PS dst, a, b: dst[m][n] += sum over k of a[m][2k] b[k][2n] + a[m][2k+1] b[k][2n+1],
 * with dst m x n float32, a m x k pairs, b k x n pairs (#UD unless the shapes agree and the
 * three tiles differ). */
static void amx_emu_dpbf16ps(int dst, int a, int b) {
    const char *bad = "TDPBF16PS: tiles not configured, unused, or shapes that do not fit (#UD)";
    if (!amx_emu_usable(dst, bad) || !amx_emu_usable(a, bad) || !amx_emu_usable(b, bad)) return;
    if (dst == a || dst == b || a == b || amx_emu.colsb[dst] % 4 || amx_emu.colsb[a] % 4 ||
        amx_emu.rows[dst] != amx_emu.rows[a] || amx_emu.colsb[a] / 4 != amx_emu.rows[b] ||
        amx_emu.colsb[dst] != amx_emu.colsb[b]) {
        amx_emu_fault(bad, dst);
        return;
    }
    const int rows = amx_emu.rows[dst], pairs = amx_emu.colsb[a] / 4, columns = amx_emu.colsb[dst] / 4;
    for (int m = 0; m < rows; m++) {
        float *out = (float *)amx_emu.data[dst][m];
        const uint16_t *x = (const uint16_t *)amx_emu.data[a][m];
        for (int k = 0; k < pairs; k++) {
            const float even = amx_emu_bf16(x[2 * k]), odd = amx_emu_bf16(x[2 * k + 1]);
            const uint16_t *w = (const uint16_t *)amx_emu.data[b][k];
            for (int n = 0; n < columns; n++) {
                float sum = out[n] + even * amx_emu_bf16(w[2 * n]);
                sum = amx_emu_flush(sum);
                out[n] = amx_emu_flush(sum + odd * amx_emu_bf16(w[2 * n + 1]));
            }
        }
    }
    __atomic_fetch_add(&amx_emulation_products, 1, __ATOMIC_RELAXED);
}

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) amx_emu_loadconfig(config)
#define _tile_release() amx_emu_release()
#define _tile_zero(tile) amx_emu_zero(tile)
#define _tile_loadd(tile, base, stride) amx_emu_loadd(tile, base, stride)
#define _tile_stored(tile, base, stride) amx_emu_stored(tile, base, stride)
#define _tile_dpbf16ps(dst, a, b) amx_emu_dpbf16ps(dst, a, b)

#endif
