/* Float32 products on a weight repacked into column panels (a checkpoint's float32
 * `Linear`, `layers/panel_linear.py`).
 *
 * y[M,N] = x[M,K] . W[N,K]^T (+ bias), then optionally silu(y), y * other or y + other.
 * W is repacked once at load (`panel_pack_f32`) into panels of PANEL output columns: panel
 * p holds K rows of PANEL floats, W[p*PANEL + j, k] at [(p*K + k)*PANEL + j] (the last
 * panel zero-padded). The product is the outer-product form: a register tile of MR rows of
 * x by the panel's PANEL columns, x[m,k] broadcast against the panel's row k, the whole
 * of K at once (a panel, K x 256 bytes, stays in L2 while every row block of x passes;
 * chunks of K kept in L1, with the sums waiting in y, measured slower).
 *
 * Batch invariance, and one result per instruction set: every output y[m,n] is one
 * float32 accumulator, a fused multiply-add per k in k order (AVX-512 lanes and the
 * portable loop's fmaf alike), whatever M, the row block it falls in or the thread. So a
 * row's result is the same alone or in any batch, and the AVX-512 and portable paths give
 * the same bits. Measured against oneDNN's packed float32 GEMM (the layer's product
 * before, `platforms/cpu_linear.py`), two threads, Zen 4: 1.1-1.9x as fast at 1 to 32 rows,
 * 0.94-1.04x at 64 to 1024 (docs/performance.md, "A float32 checkpoint's linears on
 * column panels").
 *
 * Work sharing as in quant_matmul.c: threads take units (MB rows of x by one panel) from
 * a shared counter (guided: a quarter of what is left, at least one unit).
 */
#include <math.h>

#include "quant_blocks.h"

#define PANEL 64 /* output columns a panel (4 AVX-512 vectors) */
#define MR 6     /* rows of x a register tile */
#define MB 96    /* rows of x a unit of work (a block that stays in L2 across panels) */
#define MIN_UNITS 16 /* units a product is cut into at least (where it has the rows) */

/* W [N, K] -> panels (ceil(N / PANEL) * K * PANEL floats, the last panel zero-padded). */
void panel_pack_f32(const float *w, int64_t N, int64_t K, float *out)
{
    const int64_t panels = (N + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++) {
        float *panel = out + p * K * PANEL;
        for (int64_t j = 0; j < PANEL; j++) {
            const int64_t n = p * PANEL + j;
            for (int64_t k = 0; k < K; k++) panel[k * PANEL + j] = n < N ? w[n * K + k] : 0.0f;
        }
    }
}

/* y[m, n0:n0+cols] = x[m, 0:K] . the panel's K rows, for `rows` (<= MR) rows of x. */
static void tile_scalar(const float *x, int64_t ldx, int64_t rows, const float *panel,
                        int64_t K, float *y, int64_t ldy, int64_t cols)
{
    /* k outside j: each output's chain stays in k order even where the compiler
     * vectorizes (over j) and reassociates (the library's -fassociative-math). */
    for (int64_t m = 0; m < rows; m++) {
        float t[PANEL];
        for (int64_t j = 0; j < PANEL; j++) t[j] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const float a = x[m * ldx + k];
            for (int64_t j = 0; j < PANEL; j++) t[j] = fmaf(a, panel[k * PANEL + j], t[j]);
        }
        for (int64_t j = 0; j < cols; j++) y[m * ldy + j] = t[j];
    }
}

#if QM_X86
AVX512 INLINE void tile512(const float *x, int64_t ldx, const float *panel, int64_t K,
                           float *y, int64_t ldy, const __mmask16 *mask, const int rows)
{
    __m512 acc[MR][4];
    for (int m = 0; m < rows; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *b = panel + k * PANEL;
        const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16),
                     b2 = _mm512_loadu_ps(b + 32), b3 = _mm512_loadu_ps(b + 48);
        for (int m = 0; m < rows; m++) {
            const __m512 a = _mm512_set1_ps(x[m * ldx + k]);
            acc[m][0] = _mm512_fmadd_ps(a, b0, acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(a, b1, acc[m][1]);
            acc[m][2] = _mm512_fmadd_ps(a, b2, acc[m][2]);
            acc[m][3] = _mm512_fmadd_ps(a, b3, acc[m][3]);
        }
    }
    for (int m = 0; m < rows; m++)
        for (int j = 0; j < 4; j++) _mm512_mask_storeu_ps(y + m * ldy + 16 * j, mask[j], acc[m][j]);
}

AVX512 static void tile_avx512(const float *x, int64_t ldx, int64_t rows, const float *panel,
                               int64_t K, float *y, int64_t ldy, int64_t cols)
{
    __mmask16 mask[4];
    for (int j = 0; j < 4; j++) {
        const int64_t n = cols - 16 * j;
        mask[j] = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    }
    switch (rows) {
    case 1: tile512(x, ldx, panel, K, y, ldy, mask, 1); break;
    case 2: tile512(x, ldx, panel, K, y, ldy, mask, 2); break;
    case 3: tile512(x, ldx, panel, K, y, ldy, mask, 3); break;
    case 4: tile512(x, ldx, panel, K, y, ldy, mask, 4); break;
    case 5: tile512(x, ldx, panel, K, y, ldy, mask, 5); break;
    default: tile512(x, ldx, panel, K, y, ldy, mask, MR); break;
    }
}
#endif

typedef void (*tile_fn)(const float *x, int64_t ldx, int64_t rows, const float *panel,
                        int64_t K, float *y, int64_t ldy, int64_t cols);

/* The panel kernel of level `isa` (capped at quant_best_isa()); AVX2 machines take the
 * portable loop (the layer keeps oneDNN there, `layers/panel_linear.py`). */
static tile_fn tile_for(int isa)
{
#if QM_X86
    if (isa >= ISA_AVX512 && quant_best_isa() >= ISA_AVX512) return tile_avx512;
#endif
    (void)isa;
    return tile_scalar;
}

static int take_panels(int64_t *next, int64_t panels, int64_t *p0, int64_t *np)
{
    int64_t start = __atomic_load_n(next, __ATOMIC_RELAXED);
    for (;;) {
        if (start >= panels) return 0;
        int64_t chunk = (panels - start) / 4;
        if (chunk < 1) chunk = 1;
        if (__atomic_compare_exchange_n(next, &start, start + chunk, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *p0 = start;
            *np = panels - start < chunk ? panels - start : chunk;
            return 1;
        }
    }
}

/* One panel's columns of every row of y, MR rows at a time. */
static void panel_all_rows(const float *x, int64_t M, int64_t K, const float *panel, float *y,
                           int64_t N, int64_t n0, tile_fn tile_kernel)
{
    const int64_t cols = N - n0 < PANEL ? N - n0 : PANEL;
    for (int64_t m0 = 0; m0 < M; m0 += MR)
        tile_kernel(x + m0 * K, K, M - m0 < MR ? M - m0 : MR, panel, K, y + m0 * N + n0, N, cols);
}

/* y[M,N] = op(x[M,K] . W^T + bias) over W's panels `w`; `bias` and `other` ([M,N]) may
 * be NULL; `type` is unused (the signature of quant_matmul_f32, so the decode program and
 * the thread pool call either). Units are taken from `next_unit` until none is left. */
void panel_matmul_f32(const float *x, const uint8_t *w, const float *bias, const float *other,
                      float *y, int64_t M, int64_t N, int64_t K, int type, int op, int isa,
                      int64_t *next_unit)
{
    (void)type;
    const tile_fn tile_kernel = tile_for(isa);
    const epilogue_fn epilogue = epilogue_for(isa);
    const float *panels = (const float *)w;
    /* Units: (block of MB rows, panel), block-major, so that a run of units taken at
     * once keeps its rows of x in L2 across panels; with many rows both threads share
     * every panel (few panels, e.g. 9 of a 576-wide output, split unevenly). */
    const int64_t count = (N + PANEL - 1) / PANEL;
    int64_t rows = MB; /* rows a unit: halved (in whole tiles) until there are enough units */
    while (rows > MR && (M + rows - 1) / rows * count < MIN_UNITS)
        rows = (rows / 2 + MR - 1) / MR * MR;
    const int64_t blocks = (M + rows - 1) / rows;
    for (int64_t u0, nu; take_panels(next_unit, blocks * count, &u0, &nu);)
        for (int64_t u = u0; u < u0 + nu; u++) {
            const int64_t m0 = u / count * rows, p = u % count, n0 = p * PANEL;
            const int64_t mb = M - m0 < rows ? M - m0 : rows;
            const int64_t cols = N - n0 < PANEL ? N - n0 : PANEL;
            panel_all_rows(x + m0 * K, mb, K, panels + p * K * PANEL, y + m0 * N, N, n0,
                           tile_kernel);
            epilogue(y + m0 * N, mb, N, n0, cols, bias, op, other ? other + m0 * N : 0);
        }
}

/* The same on an OpenMP team of `num_threads`. */
void panel_matmul_f32_team(const float *x, const uint8_t *w, const float *bias,
                           const float *other, float *y, int64_t M, int64_t N, int64_t K,
                           int type, int op, int isa, int num_threads)
{
    int64_t next_unit = 0;
#pragma omp parallel num_threads(num_threads)
    panel_matmul_f32(x, w, bias, other, y, M, N, K, type, op, isa, &next_unit);
}
