/* bf16 <-> float32 for the CPU kernels (a bf16 is the top half of a float32). Included by
 * kernels/cpu_*.c; kernels/cpu_build.py hashes it with each source. */
#ifndef PAGEDSERVE_CPU_BF16_H
#define PAGEDSERVE_CPU_BF16_H

#include <stdint.h>
#include <string.h>

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

#endif
