/* exp(x) for a vector of x <= 0 (-inf included), as the CPU attention kernels' softmax needs
 * it: Cephes expf (range reduction by ln 2, degree-6 polynomial, within 2 ulp), 0 below -87,
 * where expf underflows. DEFINE_EXP_NONPOSITIVE(name, float vector type, int32 vector type)
 * defines it for one width (GCC vector extensions: 8 lanes in cpu_paged_attention.c, 16 in
 * cpu_attention_bf16_dot.h). Included by kernels/cpu_*.c; cpu_build.py hashes it with them. */
#ifndef PAGEDSERVE_CPU_EXP_H
#define PAGEDSERVE_CPU_EXP_H

#define DEFINE_EXP_NONPOSITIVE(NAME, VF, VI)                                                  \
    static inline VF NAME(VF x) {                                                             \
        const VI tiny = x < -87.0f;                                                           \
        x = (VF)(((VI)x & ~tiny) | ((VI)((VF){0} - 87.0f) & tiny));                           \
        const VF y = x * 1.44269504088896341f + 0.5f;                                         \
        VF n = __builtin_convertvector(__builtin_convertvector(y, VI), VF); /* toward 0 */    \
        n -= (VF)((VI)((VF){0} + 1.0f) & (n > y)); /* floor: y <= 0.5 may be negative */     \
        const VF r = x - n * 0.693359375f + n * 2.12194440e-4f;                               \
        VF p = (VF){0} + 1.9875691500e-4f;                                                    \
        p = p * r + 1.3981999507e-3f;                                                         \
        p = p * r + 8.3334519073e-3f;                                                         \
        p = p * r + 4.1665795894e-2f;                                                         \
        p = p * r + 1.6666665459e-1f;                                                         \
        p = p * r + 5.0000001201e-1f;                                                         \
        p = p * r * r + r + 1.0f;                                                             \
        const VI two_n = (__builtin_convertvector(n, VI) + 127) << 23;                        \
        return (VF)((VI)(p * (VF)two_n) & ~tiny);                                             \
    }

#endif
