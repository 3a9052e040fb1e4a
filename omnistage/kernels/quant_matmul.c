/* Matrix products with weights kept in GGUF's quantized block formats and
 * float32 activations (the float path).
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
 * llama.cpp's way (x quantized to 8 bits per 32-block, integer dot products) is
 * quant_matmul_q8.c: faster, but its results are up to ~1 % of the output scale away
 * from the float32 product, where this path's are ~1e-6 away; this one stays for
 * whoever needs the float32 product (tests of exactness, `activations="float32"`).
 * At M = 64 it matches oneDNN's float32 GEMM.
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
#include "quant_blocks.h"
#include "quant_unpack.h"

/* ---- inner kernels: y[m, j] (+)= x[m, :kc] . w[j, :kc] for a chunk ------ */

/* x: M rows of stride ldx; w: `rows` rows of stride ldw (the dequantized tile);
 * y: stride ldy. `accumulate`: add to y instead of storing. */
typedef void (*chunk_fn)(const float *x, int64_t ldx, int64_t M, const float *w, int64_t ldw,
                         int64_t rows, int64_t kc, float *y, int64_t ldy, int accumulate);


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
    _mm_prefetch((const char *)(ptr) + ahead, _MM_HINT_T1);                        \
    if (type == T_F32) /* 128 bytes a sub-block: two cache lines */                \
        _mm_prefetch((const char *)(ptr) + ahead + 64, _MM_HINT_T1);               \
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
            const char *ahead = (const char *)rp[r] + PREFETCH_ROWS * row_bytes +
                                j * block_bytes(type) * 32 / block_elems(type);
            _mm_prefetch(ahead, _MM_HINT_T1);
            if (type == T_F32) _mm_prefetch(ahead + 64, _MM_HINT_T1);
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
    for (int64_t n0, nt; take_rows(next_unit, N, &n0, &nt);) {
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
