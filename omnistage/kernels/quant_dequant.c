/* GGUF blocks -> float32: the portable dequantizers (in the order of ggml's
 * dequantize_row_*, and gguf's quants.py), the vector ones (the float path's
 * register unpackers, stored), the run-time instruction-set choice, and the
 * exported row dequantizer (embedding rows; float-dtype loading).
 */
#include "quant_blocks.h"
#include "quant_unpack.h"

int quant_block_elems(int type) { return block_elems(type); }
int quant_block_bytes(int type) { return block_bytes(type); }

int quant_best_isa(void)
{
#if QM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

/* The portable dequantizers: `n` consecutive blocks at `b` -> n * block_elems floats
 * at `y`, in the order of ggml's dequantize_row_* (and gguf's quants.py). */
INLINE void dq_q4_0(const uint8_t *b, int64_t n, float *restrict y)
{
    for (int64_t i = 0; i < n; i++, b += 18, y += 32) {
        const float d = f16_soft(rd16(b));
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[2 + j] & 15) - 8) * d;
            y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
    }
}

INLINE void dq_q4_1(const uint8_t *b, int64_t n, float *restrict y)
{
    for (int64_t i = 0; i < n; i++, b += 20, y += 32) {
        const float d = f16_soft(rd16(b)), m = f16_soft(rd16(b + 2));
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 15) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    }
}

INLINE void dq_q8_0(const uint8_t *b, int64_t n, float *restrict y)
{
    for (int64_t i = 0; i < n; i++, b += 34, y += 32) {
        const float d = f16_soft(rd16(b));
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d;
    }
}


INLINE void dq_q4_k(const uint8_t *b, int64_t n, float *restrict y)
{
    for (int64_t i = 0; i < n; i++, b += 144, y += 256) {
        const float d = f16_soft(rd16(b)), dmin = f16_soft(rd16(b + 2));
        const uint8_t *scales = b + 4, *qs = b + 16;
        for (int j = 0; j < 4; j++) { /* sub-blocks 2j (low nibbles) and 2j+1 (high) */
            int s0, m0, s1, m1;
            scale_min_k4(2 * j, scales, &s0, &m0);
            scale_min_k4(2 * j + 1, scales, &s1, &m1);
            const float d0 = d * (float)s0, o0 = dmin * (float)m0;
            const float d1 = d * (float)s1, o1 = dmin * (float)m1;
            const uint8_t *q = qs + 32 * j;
            float *yj = y + 64 * j;
            for (int l = 0; l < 32; l++) {
                yj[l] = d0 * (float)(q[l] & 15) - o0;
                yj[l + 32] = d1 * (float)(q[l] >> 4) - o1;
            }
        }
    }
}

INLINE void dq_q6_k(const uint8_t *b, int64_t n, float *restrict y)
{
    for (int64_t i = 0; i < n; i++, b += 210, y += 256) {
        const float d = f16_soft(rd16(b + 208));
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++) { /* 128 values each */
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            const int8_t *s = sc + 8 * half;
            float *yh = y + 128 * half;
            for (int g = 0; g < 2; g++) { /* 16 values per scale */
                const float d1 = d * s[g], d2 = d * s[g + 2], d3 = d * s[g + 4], d4 = d * s[g + 6];
                for (int l = 16 * g; l < 16 * g + 16; l++) {
                    yh[l] = d1 * (float)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                    yh[l + 32] = d2 * (float)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    yh[l + 64] = d3 * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    yh[l + 96] = d4 * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
    }
}

/* Float rows: F32 copied, F16 and BF16 widened (exactly). */
INLINE void dq_float(int type, const uint8_t *b, int64_t n, float *restrict y)
{
    const int64_t values = 32 * n;
    if (type == T_F32) {
        memcpy(y, b, (size_t)values * 4);
        return;
    }
    for (int64_t i = 0; i < values; i++)
        y[i] = type == T_F16 ? f16_soft(rd16(b + 2 * i)) : bf16_to_f32(rd16(b + 2 * i));
}

INLINE void dq_any(int type, const uint8_t *b, int64_t n, float *y)
{
    switch (type) {
    case T_Q4_0: dq_q4_0(b, n, y); break;
    case T_Q4_1: dq_q4_1(b, n, y); break;
    case T_Q8_0: dq_q8_0(b, n, y); break;
    case T_Q4_K: dq_q4_k(b, n, y); break;
    case T_Q6_K: dq_q6_k(b, n, y); break;
    case T_F32: case T_F16: case T_BF16: dq_float(type, b, n, y); break;
    }
}

HIDDEN void dequant_scalar(int type, const uint8_t *b, int64_t n, float *y)
{
    dq_any(type, b, n, y);
}
#if QM_X86
/* The vector dequantizers are the small-M kernels' register dequantizers, stored. */
AVX2 INLINE void dq256(const uint8_t *b, int64_t n32, float *y, const int type)
{
    for (int64_t j = 0; j < n32; j++) {
        __m256 v[4];
        w32_256(b, j, v, type);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + 32 * j + 8 * i, v[i]);
    }
}
AVX2 HIDDEN void dequant_avx2(int type, const uint8_t *b, int64_t n, float *y)
{
    const int64_t n32 = n * block_elems(type) / 32;
    QM_FUSED_TYPES(dq256, b, n32, y)
}
AVX512 INLINE void dq512(const uint8_t *b, int64_t n32, float *y, const int type)
{
    for (int64_t j = 0; j < n32; j++) {
        __m512 lo, hi;
        w32_512(b, j, &lo, &hi, type);
        _mm512_storeu_ps(y + 32 * j, lo);
        _mm512_storeu_ps(y + 32 * j + 16, hi);
    }
}
AVX512 HIDDEN void dequant_avx512(int type, const uint8_t *b, int64_t n, float *y)
{
    const int64_t n32 = n * block_elems(type) / 32;
    QM_FUSED_TYPES(dq512, b, n32, y)
}
#endif

HIDDEN dequant_fn dequant_for(int isa)
{
#if QM_X86
    if (isa >= ISA_AVX512 && quant_best_isa() >= ISA_AVX512) return dequant_avx512;
    if (isa >= ISA_AVX2 && quant_best_isa() >= ISA_AVX2) return dequant_avx2;
#endif
    (void)isa;
    return dequant_scalar;
}

/* out[i, :] = row rows[i] of W dequantized (rows NULL: row i), for i < n_rows.
 * Returns 0, or -1 (having written nothing) when a row id is outside [0, N). */
int quant_dequantize_rows_f32(const uint8_t *w, int64_t N, int64_t K, int type,
                              const int64_t *rows, int64_t n_rows, float *out, int isa)
{
    const dequant_fn dequant = dequant_for(isa);
    const int64_t be = block_elems(type), row_bytes = K / be * block_bytes(type);
    if (rows)
        for (int64_t i = 0; i < n_rows; i++)
            if (rows[i] < 0 || rows[i] >= N) return -1;
    for (int64_t i = 0; i < n_rows; i++)
        dequant(type, w + (rows ? rows[i] : i) * row_bytes, K / be, out + i * K);
    return 0;
}
