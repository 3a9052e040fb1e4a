/* The integer dot kernels of the int8 path (quant_matmul_q8.c says what they
 * compute): a unit of W rows against x quantized to 8 bits per 32-block.
 *
 * - portable C: one output at a time, the lanes' integer sums in plain C;
 * - AVX2: 4 rows of W by up to 2 rows of x, vpmaddubsw + vpmaddwd;
 * - AVX-512 VNNI: 4 rows of W by up to 4 rows of x, vpdpbusd on 256-bit vectors
 *   (Zen 4 runs 512-bit ones as two halves: no faster, and the lanes stay the
 *   AVX2 ones, one 32-block per vector).
 * The vector kernels share one body (quant_dot8_tile.h, included once per
 * instruction set with its lane function).
 */
#include "quant_blocks.h"

/* v, hidden from the optimizer: the sums below are not reassociated (-fassociative-math),
 * so the portable path adds in the vector paths' order. */
static inline float opaque(float v)
{
    __asm__("" : "+m"(v));
    return v;
}

/* Sub-block j of a row: its 32 integers w, the scale of each 4-value lane, its min
 * coefficient (Q4_1 and Q4_K; else 0). The float operations are the vector unpacker's. */
static void unpack8_scalar(const uint8_t *row, int64_t j, int type, int32_t w[32], float sc[8],
                           float *mn)
{
    *mn = 0.0f;
    if (type == T_Q4_0 || type == T_Q4_1) {
        const int q41 = type == T_Q4_1, off = q41 ? 0 : 8;
        const uint8_t *b = row + j * (q41 ? 20 : 18), *qs = b + (q41 ? 4 : 2);
        for (int i = 0; i < 16; i++) {
            w[i] = (qs[i] & 15) - off;
            w[i + 16] = (qs[i] >> 4) - off;
        }
        for (int l = 0; l < 8; l++) sc[l] = f16_soft(rd16(b));
        if (q41) *mn = f16_soft(rd16(b + 2));
    } else if (type == T_Q8_0) {
        const uint8_t *b = row + j * 34;
        for (int i = 0; i < 32; i++) w[i] = (int8_t)b[2 + i];
        for (int l = 0; l < 8; l++) sc[l] = f16_soft(rd16(b));
    } else if (type == T_Q4_K) {
        const uint8_t *b = row + (j >> 3) * 144, *qs = b + 16 + 32 * ((j & 7) >> 1);
        const int s = (int)(j & 7);
        int scale, min;
        scale_min_k4(s, b + 4, &scale, &min);
        for (int i = 0; i < 32; i++) w[i] = (qs[i] >> (4 * (s & 1))) & 15;
        for (int l = 0; l < 8; l++) sc[l] = f16_soft(rd16(b)) * (float)scale;
        *mn = -(f16_soft(rd16(b + 2)) * (float)min);
    } else { /* T_Q6_K: a scale per 16 values */
        const uint8_t *b = row + (j >> 3) * 210;
        const int s = (int)(j & 7), half = s >> 2, quarter = s & 3;
        const int8_t *scs = (const int8_t *)(b + 192) + 8 * half + 2 * quarter;
        const uint8_t *ql = b + 64 * half + 32 * (quarter & 1), *qh = b + 128 + 32 * half;
        for (int i = 0; i < 32; i++)
            w[i] = (((ql[i] >> (quarter >= 2 ? 4 : 0)) & 15) | (((qh[i] >> (2 * quarter)) & 3) << 4)) - 32;
        for (int l = 0; l < 8; l++) sc[l] = f16_soft(rd16(b + 208)) * (float)scs[l >> 2];
    }
}

/* x row m . W row `row`. */
static float row8_scalar(struct act8 a, int64_t m, int64_t K, const uint8_t *row, int type)
{
    const int64_t nb = K / 32;
    const int8_t *q = a.q + m * K;
    float acc[8] = {0}, accm = 0.0f;
    for (int64_t j = 0; j < nb; j++) {
        int32_t w[32];
        float sc[8], mn;
        unpack8_scalar(row, j, type, w, sc, &mn);
        for (int l = 0; l < 8; l++) {
            int32_t g = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) g += w[i] * q[32 * j + i];
            acc[l] = fmaf((float)g, sc[l] * a.d[m * nb + j], acc[l]);
        }
        if (type == T_Q4_1 || type == T_Q4_K) accm = fmaf(mn, a.s[m * nb + j], accm);
    }
    const float b0 = opaque(acc[0] + acc[4]), b1 = opaque(acc[1] + acc[5]);
    const float b2 = opaque(acc[2] + acc[6]), b3 = opaque(acc[3] + acc[7]);
    return opaque(opaque(b0 + b1) + opaque(b2 + b3)) + accm;
}

HIDDEN void dot8_scalar(struct act8 a, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes,
                        int64_t nt, float *y, int64_t ldy, int type)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < nt; r++) y[m * ldy + r] = row8_scalar(a, m, K, w + r * row_bytes, type);
}

#if QM_X86
/* Sub-block j of a row as 32 bytes (unsigned: w + OFFSET8; Q8_0: the signed int8), the
 * scale of each 4-value lane, and the min coefficient (Q4_1, Q4_K). */
AVX2 INLINE __m256i unpack8_256(const uint8_t *row, int64_t j, __m256 *scale, float *mn,
                                const int type)
{
    const __m256i low4 = _mm256_set1_epi8(15);
    if (type == T_Q4_0 || type == T_Q4_1) {
        const uint8_t *b = row + j * (type == T_Q4_0 ? 18 : 20);
        const __m128i p = _mm_loadu_si128((const __m128i *)(b + (type == T_Q4_0 ? 2 : 4)));
        *scale = _mm256_set1_ps(_cvtsh_ss(rd16(b)));
        if (type == T_Q4_1) *mn = _cvtsh_ss(rd16(b + 2));
        return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low4);
    }
    if (type == T_Q8_0) {
        const uint8_t *b = row + j * 34;
        *scale = _mm256_set1_ps(_cvtsh_ss(rd16(b)));
        return _mm256_loadu_si256((const __m256i *)(b + 2));
    }
    if (type == T_Q4_K) {
        const uint8_t *b = row + (j >> 3) * 144;
        const int s = (int)(j & 7);
        int sc, m;
        scale_min_k4(s, b + 4, &sc, &m);
        *scale = _mm256_set1_ps(_cvtsh_ss(rd16(b)) * (float)sc);
        *mn = -(_cvtsh_ss(rd16(b + 2)) * (float)m);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (s >> 1)));
        return _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(s & 1 ? 4 : 0)), low4);
    }
    const uint8_t *b = row + (j >> 3) * 210; /* T_Q6_K */
    const int s = (int)(j & 7), half = s >> 2, quarter = s & 3;
    const float d = _cvtsh_ss(rd16(b + 208));
    const int8_t *scs = (const int8_t *)(b + 192) + 8 * half + 2 * quarter;
    const uint8_t *ql = b + 64 * half + 32 * (quarter & 1), *qh = b + 128 + 32 * half;
    const __m256i l = _mm256_and_si256(
        _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)ql), _mm_cvtsi32_si128(quarter >= 2 ? 4 : 0)), low4);
    const __m256i h = _mm256_and_si256(
        _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh), _mm_cvtsi32_si128(2 * quarter)),
        _mm256_set1_epi8(3));
    const float s0 = d * (float)scs[0], s1 = d * (float)scs[1];
    *scale = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
    return _mm256_or_si256(l, _mm256_slli_epi16(h, 4));
}

/* Q4_0, Q4_1, Q8_0: a block starts with its f16 scale (Q4_1: then its f16 min). */
#define SIMPLE8(type) ((type) == T_Q4_0 || (type) == T_Q4_1 || (type) == T_Q8_0)

/* The 32 weights of block j of a simple-type row (as unpack8_256, without the scales):
 * Q4_x's 16 bytes in both halves, the high half shifted by a nibble. */
AVX2 INLINE __m256i bytes8_simple(const uint8_t *row, int64_t j, const int type)
{
    if (type == T_Q8_0) return _mm256_loadu_si256((const __m256i *)(row + j * 34 + 2));
    const uint8_t *b = row + j * (type == T_Q4_0 ? 18 : 20) + (type == T_Q4_0 ? 2 : 4);
    const __m256i p = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b));
    return _mm256_and_si256(_mm256_srlv_epi32(p, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                            _mm256_set1_epi8(15));
}

/* The first 4 bytes of block j of 4 rows (scale and min, or scale and 2 bytes of
 * weights) as floats: [d0 m0 d1 m1 d2 m2 d3 m3] (vcvtph2ps: exact, as f16_soft). */
AVX2 INLINE __m256 heads4_simple(const uint8_t *const rp[4], int64_t j, const int type)
{
    const int64_t o = j * block_bytes(type);
    int32_t h[4]; /* four scalar loads into lanes (not a vector load of a stored array: a
                     store-forwarding stall on every block) */
    for (int r = 0; r < 4; r++) memcpy(&h[r], rp[r] + o, 4);
    return _mm256_cvtph_ps(_mm_setr_epi32(h[0], h[1], h[2], h[3]));
}

/* The offset o added to make a type's weights unsigned, as a shift (o = 1 << shift); 0: none. */
#define OFFSET8_SHIFT(type, vnni) \
    ((type) == T_Q4_0 ? 3 : (type) == T_Q6_K ? 5 : ((type) == T_Q8_0 && (vnni)) ? 7 : 0)

/* Lane r of the result: row8_scalar's tree over the lanes of v_r. */
AVX2 INLINE __m128 tree8x4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    const __m256 t01 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20),
                                     _mm256_permute2f128_ps(v0, v1, 0x31));
    const __m256 t23 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20),
                                     _mm256_permute2f128_ps(v2, v3, 0x31));
    __m256 h = _mm256_hadd_ps(t01, t23); /* [r0 r0 r2 r2 | r1 r1 r3 r3] */
    h = _mm256_hadd_ps(h, h);            /* [r0 r2 r0 r2 | r1 r3 r1 r3] */
    return _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

INLINE void store_rows(float *y, __m128 v, int64_t rows)
{
    if (rows == 4) {
        _mm_storeu_ps(y, v);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, v);
    for (int64_t r = 0; r < rows; r++) y[r] = t[r];
}

/* -(o * the sum of each 4-value lane of q); zero for types without an offset. */
AVX2 INLINE __m256i negoff_avx2(__m256i q, const int type)
{
    const int shift = OFFSET8_SHIFT(type, 0);
    if (!shift) return _mm256_setzero_si256();
    const __m256i sum4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum4, shift));
}

/* The 8 integer lanes of sub-block (v, q): pairs of u8 x s8 products (at most 2 * 63 * 127,
 * no saturation), then pairs of those; Q8_0 by the sign trick (|w| <= 128). */
AVX2 INLINE __m256i lanes_avx2(__m256i v, __m256i q, __m256i negoff, const int type)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (type == T_Q8_0)
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(q, v)), ones);
    const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(v, q), ones);
    return OFFSET8_SHIFT(type, 0) ? _mm256_add_epi32(dot, negoff) : dot;
}

AVX512VNNI INLINE __m256i negoff_vnni(__m256i q, const int type)
{
    const int shift = OFFSET8_SHIFT(type, 1);
    if (!shift) return _mm256_setzero_si256();
    const __m256i sum4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum4, shift));
}

/* vpdpbusd (not saturating) onto -(o * lane sums); Q8_0's bytes flipped to w + 128. */
AVX512VNNI INLINE __m256i lanes_vnni(__m256i v, __m256i q, __m256i negoff, const int type)
{
    if (type == T_Q8_0) v = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    return _mm256_dpbusd_epi32(negoff, v, q);
}

#define DOT8_TARGET AVX2
#define DOT8_MR 2
#define DOT8_TILE tile8_avx2
#define DOT8_UNIT unit8_avx2
#define DOT8_LANES lanes_avx2
#define DOT8_NEGOFF negoff_avx2
#include "quant_dot8_tile.h"

#define DOT8_TARGET AVX512VNNI
#define DOT8_MR 4
#define DOT8_TILE tile8_vnni
#define DOT8_UNIT unit8_vnni
#define DOT8_LANES lanes_vnni
#define DOT8_NEGOFF negoff_vnni
#include "quant_dot8_tile.h"

#define QM_DOT8_TYPES(fn, ...)                   \
    switch (type) {                              \
    case T_Q4_0: fn(__VA_ARGS__, T_Q4_0); break; \
    case T_Q4_1: fn(__VA_ARGS__, T_Q4_1); break; \
    case T_Q8_0: fn(__VA_ARGS__, T_Q8_0); break; \
    case T_Q4_K: fn(__VA_ARGS__, T_Q4_K); break; \
    default: fn(__VA_ARGS__, T_Q6_K); break;     \
    }

AVX2 HIDDEN void dot8_avx2(struct act8 a, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes,
                           int64_t nt, float *y, int64_t ldy, int type)
{
    QM_DOT8_TYPES(unit8_avx2, a, M, K, w, row_bytes, nt, y, ldy)
}

AVX512VNNI HIDDEN void dot8_vnni(struct act8 a, int64_t M, int64_t K, const uint8_t *w,
                                 int64_t row_bytes, int64_t nt, float *y, int64_t ldy, int type)
{
    QM_DOT8_TYPES(unit8_vnni, a, M, K, w, row_bytes, nt, y, ldy)
}
#endif
