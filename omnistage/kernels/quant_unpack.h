/* Register unpackers of the float path: the 32 weights of one 32-value sub-block
 * of a W row as float32 vectors (AVX-512: two of 16, AVX2: four of 8), used by the
 * small-M kernels (quant_matmul.c) and the vector dequantizers (quant_dequant.c).
 */
#ifndef OMNISTAGE_QUANT_UNPACK_H
#define OMNISTAGE_QUANT_UNPACK_H
#include "quant_blocks.h"
#if QM_X86


/* 0, 1, ..., 15: what a nibble stands for before its block's scale and offset. */
AVX512 INLINE __m512 nibble_values_512(void)
{
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* The 32 weights of sub-block j (32-element block j, or 1/8 of 256-element block j/8)
 * of a row, as two vectors of 16 floats. */
AVX512 INLINE void w32_512(const uint8_t *row, int64_t j, __m512 *lo, __m512 *hi, const int type)
{
    const __m128i low4 = _mm_set1_epi8(15);
    if (type == T_F32) {
        *lo = _mm512_loadu_ps((const float *)(row + 128 * j));
        *hi = _mm512_loadu_ps((const float *)(row + 128 * j + 64));
    } else if (type == T_F16) {
        *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 64 * j)));
        *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 64 * j + 32)));
    } else if (type == T_BF16) {
        const __m256i h0 = _mm256_loadu_si256((const __m256i *)(row + 64 * j));
        const __m256i h1 = _mm256_loadu_si256((const __m256i *)(row + 64 * j + 32));
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));
        *hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
    } else if (type == T_Q4_0 || type == T_Q4_1) {
        const uint8_t *b = row + j * (type == T_Q4_0 ? 18 : 20);
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + (type == T_Q4_0 ? 2 : 4)));
        __m512 vd, vm;
        if (type == T_Q4_1) { /* d and m side by side: one 32-bit broadcast, one conversion */
            uint32_t dm;
            memcpy(&dm, b, 4);
            const __m512 both = _mm512_cvtph_ps(_mm256_set1_epi32((int)dm)); /* d, m, d, m, ... */
            vd = _mm512_moveldup_ps(both);
            vm = _mm512_movehdup_ps(both);
        } else {
            const float d = _cvtsh_ss(rd16(b));
            vd = _mm512_set1_ps(d);
            vm = _mm512_set1_ps(-8.0f * d);
        }
        /* The 16 weights a nibble can stand for, fma(q, d, m) as the conversion would give
         * them, then looked up per weight (`vpermps` reads an index's low 4 bits only). */
        const __m512 table = _mm512_fmadd_ps(nibble_values_512(), vd, vm);
        *lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(q), table);
        *hi = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(q, 4)), table);
    } else if (type == T_Q8_0) {
        const uint8_t *b = row + j * 34;
        const __m512 vd = _mm512_set1_ps(_cvtsh_ss(rd16(b)));
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))), vd);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))), vd);
    } else if (type == T_Q4_K) {
        const uint8_t *b = row + (j >> 3) * 144;
        const int s = (int)(j & 7);
        int sc, mn;
        scale_min_k4(s, b + 4, &sc, &mn);
        const __m512 vd = _mm512_set1_ps(_cvtsh_ss(rd16(b)) * (float)sc);
        const __m512 vm = _mm512_set1_ps(-_cvtsh_ss(rd16(b + 2)) * (float)mn);
        const uint8_t *qs = b + 16 + 32 * (s >> 1);
        __m128i q0 = _mm_loadu_si128((const __m128i *)qs), q1 = _mm_loadu_si128((const __m128i *)(qs + 16));
        if (s & 1) {
            q0 = _mm_srli_epi16(q0, 4);
            q1 = _mm_srli_epi16(q1, 4);
        }
        const __m512 table = _mm512_fmadd_ps(nibble_values_512(), vd, vm); /* as Q4_0 / Q4_1 */
        *lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(q0), table);
        *hi = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(q1), table);
    } else { /* T_Q6_K */
        const uint8_t *b = row + (j >> 3) * 210;
        const int s = (int)(j & 7), half = s >> 2, quarter = s & 3;
        const float d = _cvtsh_ss(rd16(b + 208));
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * half + 2 * quarter;
        const uint8_t *ql = b + 64 * half + 32 * (quarter & 1), *qh = b + 128 + 32 * half;
        const __m128i lshift = _mm_cvtsi32_si128(quarter >= 2 ? 4 : 0);
        const __m128i hshift = _mm_cvtsi32_si128(2 * quarter), three = _mm_set1_epi8(3);
        for (int h = 0; h < 2; h++) {
            const __m128i l = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(ql + 16 * h)), lshift), low4);
            const __m128i u = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qh + 16 * h)), hshift), three);
            const __m128i q = _mm_or_si128(l, _mm_slli_epi16(u, 4));
            const float ds = d * (float)sc[h];
            const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)),
                                             _mm512_set1_ps(ds), _mm512_set1_ps(-32.0f * ds));
            if (h == 0) *lo = v; else *hi = v;
        }
    }
}


#define QM_FUSED_TYPES(fn, ...)                       \
    switch (type) {                                   \
    case T_Q4_0: fn(__VA_ARGS__, T_Q4_0); break;      \
    case T_Q4_1: fn(__VA_ARGS__, T_Q4_1); break;      \
    case T_Q8_0: fn(__VA_ARGS__, T_Q8_0); break;      \
    case T_Q4_K: fn(__VA_ARGS__, T_Q4_K); break;      \
    case T_F32: fn(__VA_ARGS__, T_F32); break;        \
    case T_F16: fn(__VA_ARGS__, T_F16); break;        \
    case T_BF16: fn(__VA_ARGS__, T_BF16); break;      \
    default: fn(__VA_ARGS__, T_Q6_K); break;          \
    }

/* The 32 weights of sub-block j of a row (as w32_512) as four vectors of 8 floats. */
AVX2 INLINE void w32_256(const uint8_t *row, int64_t j, __m256 v[4], const int type)
{
    const __m128i low4 = _mm_set1_epi8(15);
    __m128i q[2]; /* 32 small unsigned ints, 16 per register */
    float d, m;
    if (type == T_F32 || type == T_F16 || type == T_BF16) {
        for (int i = 0; i < 4; i++) {
            if (type == T_F32)
                v[i] = _mm256_loadu_ps((const float *)(row + 128 * j) + 8 * i);
            else if (type == T_F16)
                v[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 64 * j + 16 * i)));
            else
                v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 64 * j + 16 * i))), 16));
        }
        return;
    }
    if (type == T_Q4_0 || type == T_Q4_1) {
        const uint8_t *b = row + j * (type == T_Q4_0 ? 18 : 20);
        const __m128i p = _mm_loadu_si128((const __m128i *)(b + (type == T_Q4_0 ? 2 : 4)));
        q[0] = _mm_and_si128(p, low4);
        q[1] = _mm_and_si128(_mm_srli_epi16(p, 4), low4);
        d = _cvtsh_ss(rd16(b));
        m = type == T_Q4_0 ? -8.0f * d : _cvtsh_ss(rd16(b + 2));
    } else if (type == T_Q8_0) {
        const uint8_t *b = row + j * 34;
        const __m256 vd = _mm256_set1_ps(_cvtsh_ss(rd16(b)));
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * i)))),
                vd);
        return;
    } else if (type == T_Q4_K) {
        const uint8_t *b = row + (j >> 3) * 144;
        const int s = (int)(j & 7);
        int sc, mn;
        scale_min_k4(s, b + 4, &sc, &mn);
        d = _cvtsh_ss(rd16(b)) * (float)sc;
        m = -_cvtsh_ss(rd16(b + 2)) * (float)mn;
        const uint8_t *qs = b + 16 + 32 * (s >> 1);
        const __m128i shift = _mm_cvtsi32_si128(s & 1 ? 4 : 0);
        for (int h = 0; h < 2; h++)
            q[h] = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qs + 16 * h)), shift), low4);
    } else { /* T_Q6_K: as w32_512, one scale per 16 values */
        const uint8_t *b = row + (j >> 3) * 210;
        const int s = (int)(j & 7), half = s >> 2, quarter = s & 3;
        const float d6 = _cvtsh_ss(rd16(b + 208));
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * half + 2 * quarter;
        const uint8_t *ql = b + 64 * half + 32 * (quarter & 1), *qh = b + 128 + 32 * half;
        const __m128i lshift = _mm_cvtsi32_si128(quarter >= 2 ? 4 : 0);
        const __m128i hshift = _mm_cvtsi32_si128(2 * quarter), three = _mm_set1_epi8(3);
        for (int h = 0; h < 2; h++) {
            const __m128i l = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(ql + 16 * h)), lshift), low4);
            const __m128i u = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qh + 16 * h)), hshift), three);
            const __m128i qq = _mm_or_si128(l, _mm_slli_epi16(u, 4));
            const float ds = d6 * (float)sc[h];
            const __m256 vd = _mm256_set1_ps(ds), vm = _mm256_set1_ps(-32.0f * ds);
            v[2 * h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(qq)), vd, vm);
            v[2 * h + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(qq, 8))), vd, vm);
        }
        return;
    }
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int h = 0; h < 2; h++) {
        v[2 * h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q[h])), vd, vm);
        v[2 * h + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q[h], 8))), vd, vm);
    }
}

#endif
#endif
