/* bfloat16 <-> float32 for the kernels that read or write bfloat16 tensors (decode
 * attention's KV cache, rotary + KV write, RMSNorm): a bfloat16 is the upper half of a
 * float32, so widening is a shift, and narrowing rounds to nearest even as torch's
 * `c10::BFloat16` does (a NaN stays a quiet NaN). Plain C that loops vectorize. */
#ifndef OMNISTAGE_BF16_H
#define OMNISTAGE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* dst[i] = src[i] widened, i < count. */
static inline void widen_bf16(const uint16_t *restrict src, float *restrict dst, int64_t count)
{
    for (int64_t i = 0; i < count; i++) dst[i] = bf16_to_f32(src[i]);
}

#endif
