/* Matrix products on GGUF-quantized weights with 8-bit activations (the int8
 * path): llama.cpp's way, integer dot products per 32-value block.
 *
 * y[M,N] = x[M,K] . W[N,K]^T (+ bias, then the fused op, as quant_matmul.c), with
 * x quantized once per call (quant_act8.c: 8 bits and a float scale d_x per block of
 * 32). Each 32-value (sub-)block of a W row is read as 32 small integers w_i
 * (Q4_0: nibble - 8; Q4_1, Q4_K: nibble; Q8_0: int8; Q6_K: 6 bits - 32), with a scale
 * per 4-value lane (Q6_K: two scales per block) and, for Q4_1 and Q4_K, a min m:
 *
 *   lane l of block j  g_jl = sum of w_i q_i over i = 4l .. 4l + 3 (an exact integer)
 *   acc_l  = fma(float(g_jl), scale_jl * d_xj, acc_l)    over j in order
 *   accm   = fma(m_j, s_xj, accm)                         (s_x = d_x * sum of the q)
 *   y      = ((acc0 + acc4) + (acc1 + acc5)) + ((acc2 + acc6) + (acc3 + acc7)) + accm
 *
 * Every path computes exactly that, in that order: the integer lanes are exact
 * however they are formed (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw + vpmaddwd — no
 * saturation: |u| <= 63 there, and Q8_0 takes the sign trick —, portable C), the
 * float operations are the same ones (fma, not a multiply and an add). So the
 * result is bit for bit the same on every instruction set, and a row's result does
 * not depend on M, on its position in the batch or on the thread (batch invariance:
 * the register blocking over rows of x only shares the loads of W).
 *
 * Unsigned-by-signed products (vpdpbusd, vpmaddubsw) take w + o with o = 8 (Q4_0),
 * 32 (Q6_K) or 128 (Q8_0 under VNNI); o times the lane's sum of q is subtracted,
 * computed once per (x row, block) and shared by the rows of W.
 *
 * Accuracy: the x quantization costs up to ~1 % of the output scale (the largest error
 * over a product's outputs against the float32 product with the dequantized weights:
 * 0.5-0.7 % on random inputs, up to 1.7 % on SmolLM2's MLP activations), as llama.cpp;
 * quant_matmul.c's float path stays for exactness. Work sharing and units as in quant_matmul.c; every thread
 * taking part quantizes x itself (a few hundred ns for a decode row), so none waits.
 */
#include <stdlib.h>

#include "quant_blocks.h"

#define STACK_ACT_BYTES (1 << 16) /* quantized x up to this size lives on the stack */

/* The level whose kernels `isa` runs here: VNNI counts as ISA_AVX512. */
int quant_q8_isa(int isa)
{
#if QM_X86
    if (isa >= ISA_AVX512 && quant_best_isa() >= ISA_AVX512 && __builtin_cpu_supports("avx512vnni"))
        return ISA_AVX512;
    if (isa >= ISA_AVX2 && quant_best_isa() >= ISA_AVX2) return ISA_AVX2;
#endif
    (void)isa;
    return ISA_SCALAR;
}

static dot8_fn dot8_for(int isa)
{
#if QM_X86
    switch (quant_q8_isa(isa)) {
    case ISA_AVX512: return dot8_vnni;
    case ISA_AVX2: return dot8_avx2;
    }
#endif
    return dot8_scalar;
}

/* Units of W rows from `next_unit` until none is left, on x already quantized into `a`
 * (a.q NULL: it could not be allocated, and the units' outputs are NaN). */
static void units8(struct act8 a, const uint8_t *w, const float *bias, const float *other, float *y,
                   int64_t M, int64_t N, int64_t K, int type, int op, int isa, int64_t *next_unit)
{
    const dot8_fn dot = dot8_for(isa);
    const epilogue_fn epilogue = epilogue_for(isa);
    const int64_t row_bytes = K / block_elems(type) * block_bytes(type);
    for (int64_t first, taken; take_rows(next_unit, N, &first, &taken);)
        for (int64_t n0 = first; n0 < first + taken; n0 += UNIT_ROWS) { /* a unit stays in L1 */
            const int64_t nt = first + taken - n0 < UNIT_ROWS ? first + taken - n0 : UNIT_ROWS;
            if (!a.q) {
                for (int64_t m = 0; m < M; m++)
                    for (int64_t j = 0; j < nt; j++) y[m * N + n0 + j] = NAN;
                continue;
            }
            dot(a, M, K, w + n0 * row_bytes, row_bytes, nt, y + n0, N, type);
            epilogue(y, M, N, n0, nt, bias, op, other);
        }
}

/* y[M,N] = op(x[M,K] . W[N,K]^T + bias) with x quantized to 8 bits per block; arguments
 * as quant_matmul_f32's. */
void quant_matmul_q8(const float *x, const uint8_t *w, const float *bias, const float *other,
                     float *y, int64_t M, int64_t N, int64_t K, int type, int op, int isa,
                     int64_t *next_unit)
{
    const int64_t bytes = act8_bytes(M, K);
    _Alignas(64) uint8_t stack[STACK_ACT_BYTES];
    void *buf = bytes <= STACK_ACT_BYTES ? (void *)stack : malloc((size_t)bytes);
    struct act8 a = {0};
    if (buf) {
        a = act8_bind(buf, M, K);
        act8_quantize(x, M, K, a, isa);
    }
    units8(a, w, bias, other, y, M, N, K, type, op, isa, next_unit);
    if (buf != stack) free(buf);
}

/* The same on an OpenMP team of `num_threads` (x quantized once, before the team starts). */
void quant_matmul_q8_team(const float *x, const uint8_t *w, const float *bias, const float *other,
                          float *y, int64_t M, int64_t N, int64_t K, int type, int op, int isa,
                          int num_threads)
{
    void *buf = malloc((size_t)act8_bytes(M, K));
    struct act8 a = {0};
    if (buf) {
        a = act8_bind(buf, M, K);
        act8_quantize(x, M, K, a, isa);
    }
    int64_t next_unit = 0;
#pragma omp parallel num_threads(num_threads)
    units8(a, w, bias, other, y, M, N, K, type, op, isa, &next_unit);
    free(buf);
}
