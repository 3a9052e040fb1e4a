/* The epilogue of every product: + bias, then the fused element-wise op (SiLU,
 * a product or a sum with `other`), compiled once per instruction set so that
 * the loops vectorize with it.
 */
#include "quant_blocks.h"


/* exp(x) for the SiLU, vectorizable: 2^n * p(r) with |r| <= ln2/2 (Cephes' expf
 * polynomial, about 1 ulp); x is clamped so that 2^n stays a normal float. Every
 * multiply-add is an explicit fmaf, so the portable build (no FMA: a libm call) and the
 * vector ones (where -ffp-contract would fuse them anyway) compute the same floats. */
INLINE float exp_vec(float x)
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

INLINE void epilogue(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt, const float *bias,
                     int op, const float *other)
{
    for (int64_t m = 0; m < M; m++) {
        float *row = y + m * N + n0;
        const float *o = other ? other + m * N + n0 : 0;
        if (bias)
            for (int64_t j = 0; j < nt; j++) row[j] += bias[n0 + j];
        if (op == OP_SILU)
            for (int64_t j = 0; j < nt; j++) row[j] = row[j] / (1.0f + exp_vec(-row[j]));
        else if (op == OP_MUL)
            for (int64_t j = 0; j < nt; j++) row[j] *= o[j];
        else if (op == OP_ADD)
            for (int64_t j = 0; j < nt; j++) row[j] += o[j];
    }
}

HIDDEN void epilogue_scalar(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                            const float *bias, int op, const float *other)
{
    epilogue(y, M, N, n0, nt, bias, op, other);
}
#if QM_X86
AVX2 HIDDEN void epilogue_avx2(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                               const float *bias, int op, const float *other)
{
    epilogue(y, M, N, n0, nt, bias, op, other);
}
AVX512 HIDDEN void epilogue_avx512(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                                   const float *bias, int op, const float *other)
{
    epilogue(y, M, N, n0, nt, bias, op, other);
}
#endif

HIDDEN epilogue_fn epilogue_for(int isa)
{
#if QM_X86
    if (isa >= ISA_AVX512 && quant_best_isa() >= ISA_AVX512) return epilogue_avx512;
    if (isa >= ISA_AVX2 && quant_best_isa() >= ISA_AVX2) return epilogue_avx2;
#endif
    (void)isa;
    return epilogue_scalar;
}
