/* The epilogue of every product: + bias, then the fused element-wise op (SiLU,
 * a product or a sum with `other`), compiled once per instruction set so that
 * the loops vectorize with it.
 */
#include "exp_vec.h"
#include "quant_blocks.h"


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
