/* Matrix products with weights kept in GGUF's quantized block formats.
 *
 * y[M,N] = x[M,K] . W[N,K]^T (+ bias), then optionally silu(y), y * other or
 * y + other, where each of W's N rows is K / block_elems consecutive ggml
 * blocks (block_q4_0, block_q4_1, block_q8_0, block_q4_K, block_q6_K), exactly
 * as a GGUF file stores them.
 *
 * Approach: W is dequantized to float32 and multiplied against float32 x with
 * FMAs, so the result is the float32 product with the dequantized weight up to
 * summation order:
 * - M <= 4 (decode): each 32-value sub-block is dequantized in registers
 *   straight into the FMAs, 4 rows of W at a time sharing the x loads, with
 *   the rows 16 ahead prefetched (rows are too short for the hardware
 *   prefetcher to ramp up on, and a decode step reads W from memory);
 * - larger M: a tile of W (16 rows by 256 columns, 16 KB) is dequantized into
 *   a buffer that stays in L1 while every row of x passes over it; the inner
 *   kernel is a register-blocked dot product (4 rows of x by 4 of W, one
 *   vector accumulator each, reduced once per tile).
 * Batch invariance: whatever M and whichever path, every output is summed the same
 * way — over K in chunks of KC values, each chunk in one vector accumulator per
 * (x row, W row) (lane l takes the values l, l + width, ...), its lanes reduced by
 * one fixed tree, the chunks added in order. So a row's result does not depend on
 * the rows it is batched with (batched = alone, speculative verification = plain
 * decode, bit for bit).
 * llama.cpp's way (x quantized to 8 bits per 32-block, integer dot products)
 * was measured too: a prototype ran batch-1 Q4_1 about 1.7x faster on Zen 4
 * (VNNI), but its results are ~0.4 % of the output scale away from the
 * float32 product (greedy tokens would stop matching the float32 model's),
 * where this path is ~1e-6 away. At M = 64 it matches oneDNN's float32 GEMM.
 *
 * Instruction sets are chosen at run time (`isa` argument, capped at
 * `quant_best_isa()`): AVX-512 (F, BW, VL), AVX2 + FMA + F16C, or portable C.
 * The library is built without -march=native: the portable path is plain C
 * compiled for the baseline target (tests run it on any machine), the vector
 * paths are intrinsics in functions with a target attribute.
 *
 * Work sharing, as in paged_attention.c: units are tiles of UNIT_ROWS rows of
 * W (N). Callers on several threads pass the same counter (zero at the start)
 * and take units from it until none is left; a `_team` twin runs the same on
 * an OpenMP team (torch's pool, when it has several threads).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define QM_X86 1
#else
#define QM_X86 0
#endif

enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14 }; /* ggml type ids */
enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
enum { OP_NONE = 0, OP_SILU = 1, OP_MUL = 2, OP_ADD = 3 };

#define UNIT_ROWS 16   /* rows of W per unit of work */
#define BUF_FLOATS 4096 /* the dequantized tile: 16 KB */
#define KC 256          /* values of K summed before a reduction (a multiple of every block) */
#define TILE_ROWS (BUF_FLOATS / KC)
#define INLINE static inline __attribute__((always_inline))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* ---- block formats ------------------------------------------------------ */

/* (static: an exported function is not inlined under -fPIC, and these must fold
 * to constants in the kernels) */
static inline int block_elems(int type)
{
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q8_0: return 32;
    case T_Q4_K: case T_Q6_K: return 256;
    default: return 0;
    }
}

static inline int block_bytes(int type)
{
    switch (type) {
    case T_Q4_0: return 18;  /* f16 d, 16 bytes of nibbles */
    case T_Q4_1: return 20;  /* f16 d, f16 m, 16 bytes of nibbles */
    case T_Q8_0: return 34;  /* f16 d, 32 int8 */
    case T_Q4_K: return 144; /* f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles */
    case T_Q6_K: return 210; /* 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, f16 d */
    default: return 0;
    }
}

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

static inline uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* IEEE half to float without F16C, subnormals included (and without relying on the
 * CPU's handling of float subnormals, which a library built with fast-math turns off). */
INLINE float f16_soft(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = h & 0x7c00, mant = h & 0x3ff;
    uint32_t bits = sign | (((uint32_t)(h & 0x7fff) << 13) + (112u << 23));
    if (exp == 0x7c00) bits |= 0x7f800000u;
    float f;
    memcpy(&f, &bits, 4);
    if (exp == 0) {
        f = (float)mant * 5.9604644775390625e-08f; /* mant * 2^-24 */
        if (sign) f = -f;
    }
    return f;
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

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7). */
INLINE void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
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

INLINE void dq_any(int type, const uint8_t *b, int64_t n, float *y)
{
    switch (type) {
    case T_Q4_0: dq_q4_0(b, n, y); break;
    case T_Q4_1: dq_q4_1(b, n, y); break;
    case T_Q8_0: dq_q8_0(b, n, y); break;
    case T_Q4_K: dq_q4_k(b, n, y); break;
    case T_Q6_K: dq_q6_k(b, n, y); break;
    }
}

/* ---- epilogue: bias, then the fused element-wise op --------------------- */

/* exp(x) for the SiLU, vectorizable: 2^n * p(r) with |r| <= ln2/2 (Cephes' expf
 * polynomial, about 1 ulp); x is clamped so that 2^n stays a normal float. */
INLINE float exp_vec(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float t = x * 1.44269504f;
    const int n = (int)(t + (t >= 0.0f ? 0.5f : -0.5f));
    const float r = (x - (float)n * 0.693359375f) + (float)n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
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

/* ---- inner kernels: y[m, j] (+)= x[m, :kc] . w[j, :kc] for a chunk ------ */

/* x: M rows of stride ldx; w: `rows` rows of stride ldw (the dequantized tile);
 * y: stride ldy. `accumulate`: add to y instead of storing. */
typedef void (*chunk_fn)(const float *x, int64_t ldx, int64_t M, const float *w, int64_t ldw,
                         int64_t rows, int64_t kc, float *y, int64_t ldy, int accumulate);

static inline void put(float *y, float v, int accumulate) { *y = accumulate ? *y + v : v; }

static void chunk_scalar(const float *x, int64_t ldx, int64_t M, const float *w, int64_t ldw,
                         int64_t rows, int64_t kc, float *y, int64_t ldy, int accumulate)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < rows; j++) {
            const float *a = x + m * ldx, *b = w + j * ldw;
            float s = 0.0f;
            for (int64_t k = 0; k < kc; k++) s += a[k] * b[k];
            put(y + m * ldy + j, s, accumulate);
        }
}

#if QM_X86
/* Lane j of the result: the sum of the lanes of v[j], j < 4. */
AVX512 INLINE __m128 sum_lanes4_512(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    const __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    const __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    const __m512d ad = _mm512_castps_pd(a), bd = _mm512_castps_pd(b);
    const __m512 c = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ad, bd)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(ad, bd)));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(c),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* y[0:nr] (+)= the first nr lanes of v (SSE only: inlined into both vector paths). */
INLINE void put4(float *y, __m128 v, int64_t nr, int accumulate)
{
    if (nr == 4) {
        if (accumulate) v = _mm_add_ps(v, _mm_loadu_ps(y));
        _mm_storeu_ps(y, v);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, v);
    for (int64_t j = 0; j < nr; j++) put(y + j, t[j], accumulate);
}

/* MR rows of x by 4 rows of w (kc a multiple of 16). */
AVX512 INLINE void tile512(const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t nr,
                           int64_t kc, float *y, int64_t ldy, int accumulate, const int MR)
{
    const float *w1 = w + (nr > 1 ? ldw : 0), *w2 = w + (nr > 2 ? 2 * ldw : 0),
                *w3 = w + (nr > 3 ? 3 * ldw : 0);
    __m512 acc[4][4];
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k += 16) {
        const __m512 b0 = _mm512_loadu_ps(w + k), b1 = _mm512_loadu_ps(w1 + k),
                     b2 = _mm512_loadu_ps(w2 + k), b3 = _mm512_loadu_ps(w3 + k);
        for (int m = 0; m < MR; m++) {
            const __m512 a = _mm512_loadu_ps(x + m * ldx + k);
            acc[m][0] = _mm512_fmadd_ps(a, b0, acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(a, b1, acc[m][1]);
            acc[m][2] = _mm512_fmadd_ps(a, b2, acc[m][2]);
            acc[m][3] = _mm512_fmadd_ps(a, b3, acc[m][3]);
        }
    }
    /* the same reduction per (x row, W row) as the small-M kernel's (batch invariance) */
    for (int m = 0; m < MR; m++)
        put4(y + m * ldy, sum_lanes4_512(acc[m][0], acc[m][1], acc[m][2], acc[m][3]), nr,
             accumulate);
}

AVX512 static void chunk_avx512(const float *x, int64_t ldx, int64_t M, const float *w,
                                int64_t ldw, int64_t rows, int64_t kc, float *y, int64_t ldy,
                                int accumulate)
{
    for (int64_t m = 0; m < M; m += 4) {
        const int64_t mr = M - m < 4 ? M - m : 4;
        const float *xm = x + m * ldx;
        float *ym = y + m * ldy;
        for (int64_t j = 0; j < rows; j += 4) {
            const int64_t nr = rows - j < 4 ? rows - j : 4;
            const float *wj = w + j * ldw;
            switch (mr) {
            case 4: tile512(xm, ldx, wj, ldw, nr, kc, ym + j, ldy, accumulate, 4); break;
            case 3: tile512(xm, ldx, wj, ldw, nr, kc, ym + j, ldy, accumulate, 3); break;
            case 2: tile512(xm, ldx, wj, ldw, nr, kc, ym + j, ldy, accumulate, 2); break;
            default: tile512(xm, ldx, wj, ldw, nr, kc, ym + j, ldy, accumulate, 1); break;
            }
        }
    }
}

/* Lane j of the result: the sum of the lanes of v[j], j < 4. */
AVX2 INLINE __m128 sum_lanes4_256(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* MR (1 or 2) rows of x by 4 rows of w (kc a multiple of 8): 16 ymm registers. */
AVX2 INLINE void tile256(const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t nr,
                         int64_t kc, float *y, int64_t ldy, int accumulate, const int MR)
{
    const float *w1 = w + (nr > 1 ? ldw : 0), *w2 = w + (nr > 2 ? 2 * ldw : 0),
                *w3 = w + (nr > 3 ? 3 * ldw : 0);
    __m256 acc[2][4];
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k += 8) {
        const __m256 b0 = _mm256_loadu_ps(w + k), b1 = _mm256_loadu_ps(w1 + k),
                     b2 = _mm256_loadu_ps(w2 + k), b3 = _mm256_loadu_ps(w3 + k);
        for (int m = 0; m < MR; m++) {
            const __m256 a = _mm256_loadu_ps(x + m * ldx + k);
            acc[m][0] = _mm256_fmadd_ps(a, b0, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(a, b1, acc[m][1]);
            acc[m][2] = _mm256_fmadd_ps(a, b2, acc[m][2]);
            acc[m][3] = _mm256_fmadd_ps(a, b3, acc[m][3]);
        }
    }
    for (int m = 0; m < MR; m++)
        put4(y + m * ldy, sum_lanes4_256(acc[m][0], acc[m][1], acc[m][2], acc[m][3]), nr,
                  accumulate);
}

AVX2 static void chunk_avx2(const float *x, int64_t ldx, int64_t M, const float *w, int64_t ldw,
                            int64_t rows, int64_t kc, float *y, int64_t ldy, int accumulate)
{
    for (int64_t m = 0; m < M; m += 2) {
        const float *xm = x + m * ldx;
        float *ym = y + m * ldy;
        for (int64_t j = 0; j < rows; j += 4) {
            const int64_t nr = rows - j < 4 ? rows - j : 4;
            if (M - m >= 2)
                tile256(xm, ldx, w + j * ldw, ldw, nr, kc, ym + j, ldy, accumulate, 2);
            else
                tile256(xm, ldx, w + j * ldw, ldw, nr, kc, ym + j, ldy, accumulate, 1);
        }
    }
}

/* ---- small M: dequantize in registers, straight into the FMAs ------------ */

/* Rows of W ahead of the current ones whose bytes are prefetched: a decode step
 * reads W from memory, and rows are too short for the hardware prefetcher to
 * ramp up on. */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 16
#endif

/* The 32 weights of sub-block j (32-element block j, or 1/8 of 256-element block j/8)
 * of a row, as two vectors of 16 floats. */
AVX512 INLINE void w32_512(const uint8_t *row, int64_t j, __m512 *lo, __m512 *hi, const int type)
{
    const __m128i low4 = _mm_set1_epi8(15);
    if (type == T_Q4_0 || type == T_Q4_1) {
        const uint8_t *b = row + j * (type == T_Q4_0 ? 18 : 20);
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + (type == T_Q4_0 ? 2 : 4)));
        const float d = _cvtsh_ss(rd16(b)), m = type == T_Q4_0 ? -8.0f * d : _cvtsh_ss(rd16(b + 2));
        const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
        *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, low4))), vd, vm);
        *hi = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low4))), vd, vm);
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
        *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q0, low4))), vd, vm);
        *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q1, low4))), vd, vm);
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

/* y[m, 0:rows] = x[m] . W[row] for MR rows of x and up to 4 rows of W, whole K. */
AVX512 INLINE void fused512(const float *x, int64_t K, const uint8_t *w, int64_t row_bytes,
                            int64_t rows, float *y, int64_t ldy, const int type, const int MR)
{
    const uint8_t *r1 = w + (rows > 1 ? row_bytes : 0), *r2 = w + (rows > 2 ? 2 * row_bytes : 0),
                  *r3 = w + (rows > 3 ? 3 * row_bytes : 0);
    __m512 acc[4][4];
    for (int64_t j = 0; j < K / 32; j++) {
        if (j % (KC / 32) == 0)
            for (int m = 0; m < MR; m++)
                for (int r = 0; r < 4; r++) acc[m][r] = _mm512_setzero_ps();
        const int64_t ahead = PREFETCH_ROWS * row_bytes + j * block_bytes(type) * 32 / block_elems(type);
        __m512 xl[4], xh[4], lo, hi;
        for (int m = 0; m < MR; m++) {
            xl[m] = _mm512_loadu_ps(x + m * K + 32 * j);
            xh[m] = _mm512_loadu_ps(x + m * K + 32 * j + 16);
        }
#define QM_ROW(r, ptr)                                                             \
    _mm_prefetch((const char *)(ptr) + ahead, _MM_HINT_T0);                        \
    w32_512(ptr, j, &lo, &hi, type);                                               \
    for (int m = 0; m < MR; m++)                                                   \
        acc[m][r] = _mm512_fmadd_ps(xh[m], hi, _mm512_fmadd_ps(xl[m], lo, acc[m][r]));
        QM_ROW(0, w)
        QM_ROW(1, r1)
        QM_ROW(2, r2)
        QM_ROW(3, r3)
#undef QM_ROW
        if ((j + 1) % (KC / 32) == 0 || j + 1 == K / 32) /* a chunk of KC values ends */
            for (int m = 0; m < MR; m++)
                put4(y + m * ldy, sum_lanes4_512(acc[m][0], acc[m][1], acc[m][2], acc[m][3]),
                     rows, j >= KC / 32);
    }
}

#define QM_FUSED_TYPES(fn, ...)                       \
    switch (type) {                                   \
    case T_Q4_0: fn(__VA_ARGS__, T_Q4_0); break;      \
    case T_Q4_1: fn(__VA_ARGS__, T_Q4_1); break;      \
    case T_Q8_0: fn(__VA_ARGS__, T_Q8_0); break;      \
    case T_Q4_K: fn(__VA_ARGS__, T_Q4_K); break;      \
    default: fn(__VA_ARGS__, T_Q6_K); break;          \
    }

AVX512 INLINE void fused512_m(const float *x, int64_t K, const uint8_t *w, int64_t row_bytes,
                              int64_t rows, float *y, int64_t ldy, int64_t M, const int type)
{
    switch (M) {
    case 1: fused512(x, K, w, row_bytes, rows, y, ldy, type, 1); break;
    case 2: fused512(x, K, w, row_bytes, rows, y, ldy, type, 2); break;
    case 3: fused512(x, K, w, row_bytes, rows, y, ldy, type, 3); break;
    default: fused512(x, K, w, row_bytes, rows, y, ldy, type, 4); break;
    }
}

/* y[0:M, 0:rows] for M <= 4 and rows <= 4. */
AVX512 static void small_avx512(const float *x, int64_t M, int64_t K, const uint8_t *w,
                                int64_t row_bytes, int64_t rows, float *y, int64_t ldy, int type)
{
    QM_FUSED_TYPES(fused512_m, x, K, w, row_bytes, rows, y, ldy, M)
}

/* The 32 weights of sub-block j of a row (as w32_512) as four vectors of 8 floats. */
AVX2 INLINE void w32_256(const uint8_t *row, int64_t j, __m256 v[4], const int type)
{
    const __m128i low4 = _mm_set1_epi8(15);
    __m128i q[2]; /* 32 small unsigned ints, 16 per register */
    float d, m;
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

/* y[m, 0:rows] = x[m] . W[row] for MR (1 or 2) rows of x and up to 4 rows of W. */
AVX2 INLINE void fused256(const float *x, int64_t K, const uint8_t *w, int64_t row_bytes,
                          int64_t rows, float *y, int64_t ldy, const int type, const int MR)
{
    const uint8_t *rp[4];
    for (int r = 0; r < 4; r++) rp[r] = w + (rows > r ? r * row_bytes : 0);
    __m256 acc[2][4];
    for (int64_t j = 0; j < K / 32; j++) {
        if (j % (KC / 32) == 0)
            for (int m = 0; m < MR; m++)
                for (int r = 0; r < 4; r++) acc[m][r] = _mm256_setzero_ps();
        for (int r = 0; r < 4; r++) {
            __m256 v[4];
            _mm_prefetch((const char *)rp[r] + PREFETCH_ROWS * row_bytes +
                             j * block_bytes(type) * 32 / block_elems(type),
                         _MM_HINT_T0);
            w32_256(rp[r], j, v, type);
            for (int m = 0; m < MR; m++)
                for (int i = 0; i < 4; i++)
                    acc[m][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + 32 * j + 8 * i), v[i], acc[m][r]);
        }
        if ((j + 1) % (KC / 32) == 0 || j + 1 == K / 32) /* a chunk of KC values ends */
            for (int m = 0; m < MR; m++)
                put4(y + m * ldy, sum_lanes4_256(acc[m][0], acc[m][1], acc[m][2], acc[m][3]),
                     rows, j >= KC / 32);
    }
}

AVX2 INLINE void fused256_m(const float *x, int64_t K, const uint8_t *w, int64_t row_bytes,
                            int64_t rows, float *y, int64_t ldy, int64_t M, const int type)
{
    if (M == 1)
        fused256(x, K, w, row_bytes, rows, y, ldy, type, 1);
    else
        fused256(x, K, w, row_bytes, rows, y, ldy, type, 2);
}

/* y[0:M, 0:rows] for M <= 2 and rows <= 4. */
AVX2 static void small_avx2(const float *x, int64_t M, int64_t K, const uint8_t *w,
                            int64_t row_bytes, int64_t rows, float *y, int64_t ldy, int type)
{
    QM_FUSED_TYPES(fused256_m, x, K, w, row_bytes, rows, y, ldy, M)
}
#endif

/* ---- the per-instruction-set entry points -------------------------------- */

typedef void (*dequant_fn)(int type, const uint8_t *b, int64_t n, float *y);
typedef void (*epilogue_fn)(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                            const float *bias, int op, const float *other);

static void dequant_scalar(int type, const uint8_t *b, int64_t n, float *y)
{
    dq_any(type, b, n, y);
}
static void epilogue_scalar(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                            const float *bias, int op, const float *other)
{
    epilogue(y, M, N, n0, nt, bias, op, other);
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
AVX2 static void dequant_avx2(int type, const uint8_t *b, int64_t n, float *y)
{
    const int64_t n32 = n * block_elems(type) / 32;
    QM_FUSED_TYPES(dq256, b, n32, y)
}
AVX2 static void epilogue_avx2(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                               const float *bias, int op, const float *other)
{
    epilogue(y, M, N, n0, nt, bias, op, other);
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
AVX512 static void dequant_avx512(int type, const uint8_t *b, int64_t n, float *y)
{
    const int64_t n32 = n * block_elems(type) / 32;
    QM_FUSED_TYPES(dq512, b, n32, y)
}
AVX512 static void epilogue_avx512(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                                   const float *bias, int op, const float *other)
{
    epilogue(y, M, N, n0, nt, bias, op, other);
}
#endif

/* y[0:M, 0:rows] = x[0:M] . W[0:rows]^T for M <= small_m and rows <= 4, dequantizing
 * in registers (no tile buffer: with so few x rows, storing and reloading the tile
 * would cost as much as the FMAs). */
typedef void (*small_fn)(const float *x, int64_t M, int64_t K, const uint8_t *w,
                         int64_t row_bytes, int64_t rows, float *y, int64_t ldy, int type);

struct isa_ops {
    dequant_fn dequant;
    chunk_fn chunk;
    epilogue_fn epilogue;
    small_fn small;  /* NULL: small M goes through the tile buffer too */
    int64_t small_m; /* the most rows of x `small` takes */
};

static struct isa_ops ops_for(int isa)
{
#if QM_X86
    if (isa >= ISA_AVX512 && quant_best_isa() >= ISA_AVX512)
        return (struct isa_ops){dequant_avx512, chunk_avx512, epilogue_avx512, small_avx512, 4};
    if (isa >= ISA_AVX2 && quant_best_isa() >= ISA_AVX2)
        return (struct isa_ops){dequant_avx2, chunk_avx2, epilogue_avx2, small_avx2, 2};
#endif
    (void)isa;
    return (struct isa_ops){dequant_scalar, chunk_scalar, epilogue_scalar, 0, 0};
}

/* y[M,N] = op(x[M,K] . W[N,K]^T + bias); `bias` and `other` ([M,N]) may be NULL.
 * Units of UNIT_ROWS rows of W are taken from `next_unit` until none is left. */
void quant_matmul_f32(const float *x, const uint8_t *w, const float *bias, const float *other,
                      float *y, int64_t M, int64_t N, int64_t K, int type, int op, int isa,
                      int64_t *next_unit)
{
    const struct isa_ops ops = ops_for(isa);
    const int64_t be = block_elems(type), bb = block_bytes(type);
    const int64_t row_bytes = K / be * bb;
    /* The tile: TILE_ROWS rows of W by KC values, in L1 while every x row passes over
     * it; KC is also the reduction chunk of the small-M kernels (batch invariance). */
    const int64_t rows_per_tile = TILE_ROWS, kc_max = KC;
    float buf[BUF_FLOATS] __attribute__((aligned(64)));
    const int64_t units = (N + UNIT_ROWS - 1) / UNIT_ROWS;
    for (;;) {
        const int64_t u = __atomic_fetch_add(next_unit, 1, __ATOMIC_RELAXED);
        if (u >= units) break;
        const int64_t n0 = u * UNIT_ROWS, nt = N - n0 < UNIT_ROWS ? N - n0 : UNIT_ROWS;
        if (M <= ops.small_m) {
            for (int64_t r0 = 0; r0 < nt; r0 += 4)
                ops.small(x, M, K, w + (n0 + r0) * row_bytes, row_bytes, nt - r0 < 4 ? nt - r0 : 4,
                          y + n0 + r0, N, type);
            ops.epilogue(y, M, N, n0, nt, bias, op, other);
            continue;
        }
        for (int64_t r0 = 0; r0 < nt; r0 += rows_per_tile) {
            const int64_t rows = nt - r0 < rows_per_tile ? nt - r0 : rows_per_tile;
            for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
                const int64_t kc = K - k0 < kc_max ? K - k0 : kc_max;
                for (int64_t r = 0; r < rows; r++)
                    ops.dequant(type, w + (n0 + r0 + r) * row_bytes + k0 / be * bb, kc / be,
                                buf + r * kc_max);
                ops.chunk(x + k0, K, M, buf, kc_max, rows, kc, y + n0 + r0, N, k0 > 0);
            }
        }
        ops.epilogue(y, M, N, n0, nt, bias, op, other);
    }
}

/* The same on an OpenMP team of `num_threads`. */
void quant_matmul_f32_team(const float *x, const uint8_t *w, const float *bias,
                           const float *other, float *y, int64_t M, int64_t N, int64_t K,
                           int type, int op, int isa, int num_threads)
{
    int64_t next_unit = 0;
#pragma omp parallel num_threads(num_threads)
    quant_matmul_f32(x, w, bias, other, y, M, N, K, type, op, isa, &next_unit);
}

/* out[i, :] = row rows[i] of W dequantized (rows NULL: row i), for i < n_rows.
 * Returns 0, or -1 (having written nothing) when a row id is outside [0, N). */
int quant_dequantize_rows_f32(const uint8_t *w, int64_t N, int64_t K, int type,
                              const int64_t *rows, int64_t n_rows, float *out, int isa)
{
    const struct isa_ops ops = ops_for(isa);
    const int64_t be = block_elems(type), row_bytes = K / be * block_bytes(type);
    if (rows)
        for (int64_t i = 0; i < n_rows; i++)
            if (rows[i] < 0 || rows[i] >= N) return -1;
    for (int64_t i = 0; i < n_rows; i++)
        ops.dequant(type, w + (rows ? rows[i] : i) * row_bytes, K / be, out + i * K);
    return 0;
}
