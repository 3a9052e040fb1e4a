/* Activations quantized to 8 bits per 32-value block, as llama.cpp's Q8_0 / Q8_1
 * (with a float32 scale instead of a half): the left operand of the integer dot
 * products of quant_matmul_q8.c.
 *
 * Per block of 32 values: amax = max |x|, d = amax / 127, q = x * (1 / d)
 * rounded to the nearest integer (ties to even), s = d * sum(q) (the sum is what
 * the min term of Q4_1 and Q4_K multiplies). Every path computes exactly these
 * float operations (one multiply per value, one division each for d and 1 / d),
 * and max and integer sums are exact in any order, so the quantized rows are bit
 * for bit the same on every instruction set, whatever M.
 */
#include "quant_blocks.h"

/* v rounded to the nearest integer, ties to even, for |v| < 2^22 (as cvtps2dq under
 * the default rounding mode; no libm call, and no addition the optimizer may fold:
 * the integer is read from the bits of v + 1.5 * 2^23). */
static inline int32_t round_even(float v)
{
    const float t = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, 4);
    return bits - 0x4B400000;
}

static void quantize_scalar(const float *x, int64_t n_blocks, struct act8 a)
{
    for (int64_t j = 0; j < n_blocks; j++, x += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            const float v = x[i] < 0.0f ? -x[i] : x[i];
            amax = v > amax ? v : amax;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            const int32_t q = round_even(x[i] * id);
            a.q[32 * j + i] = (int8_t)q;
            sum += q;
        }
        a.d[j] = d;
        a.s[j] = d * (float)sum;
    }
}

#if QM_X86
AVX2 static void quantize_avx2(const float *x, int64_t n_blocks, struct act8 a)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t j = 0; j < n_blocks; j++, x += 32) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
        __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                  _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        /* packs work within 128-bit halves: the permutation puts the values back in order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(a.q + 32 * j), _mm256_permutevar8x32_epi32(p, order));
        a.d[j] = d;
        a.s[j] = d * (float)_mm_cvtsi128_si32(s4);
    }
}
#endif

HIDDEN void act8_quantize(const float *x, int64_t M, int64_t K, struct act8 a, int isa)
{
#if QM_X86
    if (isa >= ISA_AVX2 && quant_best_isa() >= ISA_AVX2) {
        quantize_avx2(x, M * K / 32, a);
        return;
    }
#endif
    (void)isa;
    quantize_scalar(x, M * K / 32, a);
}
