/* `exp_vec`: a float exp that loops vectorize (libm's `expf` keeps GCC 12 from it), shared
 * by the products' SiLU epilogue (quant_epilogue.c) and decode attention's softmax
 * (paged_attention.c). */
#ifndef OMNISTAGE_EXP_VEC_H
#define OMNISTAGE_EXP_VEC_H

#include <math.h>
#include <stdint.h>

/* exp(x), vectorizable (the SiLU epilogue's, the decode attention's softmax): 2^n * p(r) with |r| <= ln2/2 (Cephes' expf
 * polynomial, about 1 ulp); x is clamped so that 2^n stays a normal float. Every
 * multiply-add is an explicit fmaf, so the portable build (no FMA: a libm call) and the
 * vector ones (where -ffp-contract would fuse them anyway) compute the same floats. */
static inline __attribute__((always_inline)) float exp_vec(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float fn = rintf(x * 1.44269504f);
    const int n = (int)fn;
    const float r = fmaf(fn, 2.12194440e-4f, fmaf(-fn, 0.693359375f, x));
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;
    const union { uint32_t u; float f; } scale = {(uint32_t)(n + 127) << 23};
    return p * scale.f;
}

#endif
