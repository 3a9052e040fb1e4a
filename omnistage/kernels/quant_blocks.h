/* What every quantized-matmul source shares: ggml's block formats, the
 * instruction-set levels and their target attributes, half-to-float conversion,
 * and the functions one source defines for the others (hidden: not exported from
 * the library).
 *
 * The library (`kernels.load_quant()`) is built from several .c files by concept:
 * quant_dequant.c (blocks -> float32 rows), quant_epilogue.c (bias and the fused
 * element-wise op), quant_matmul.c (float32 activations, dequantized weights),
 * quant_act8.c (activations -> 8 bits per 32-block) and quant_matmul_q8.c (integer
 * dot products on those), all built without -march=native: vector paths are
 * functions with a target attribute, chosen at run time.
 */
#ifndef OMNISTAGE_QUANT_BLOCKS_H
#define OMNISTAGE_QUANT_BLOCKS_H
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
/* Float types (ggml's F32, F16, BF16), run as blocks of 32 values with no scale: a GGUF
 * file's float matrices stay in their format and take the same kernels. */
enum { T_F32 = 0, T_F16 = 1, T_BF16 = 30 };
enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
enum { OP_NONE = 0, OP_SILU = 1, OP_MUL = 2, OP_ADD = 3 };

#define UNIT_ROWS 16   /* rows of W per unit of work */
#define GUIDED_TAKE 0
#define BUF_FLOATS 4096 /* the dequantized tile: 16 KB */
#define KC 256          /* values of K summed before a reduction (a multiple of every block) */
#define TILE_ROWS (BUF_FLOATS / KC)
#define INLINE static inline __attribute__((always_inline))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define HIDDEN __attribute__((visibility("hidden")))

/* Rows of W ahead of the current ones whose bytes are prefetched: a decode step
 * reads W from memory, and rows are too short for the hardware prefetcher to
 * ramp up on. The prefetches go to L2 (`_MM_HINT_T1`): into L1 (T0) each waited in one
 * of L1's few miss buffers, which capped a thread at ~8-12 GB/s from memory; to L2 one
 * thread reads F16 / F32 / Q8_0 rows at ~17-20 GB/s (Zen 4, 2026-11-27, docs/performance.md). */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 16
#endif

/* Rows [*n0, *n0 + *nt) of W's N for the calling thread, taken from `next` (the rows
 * handed out so far, zero at the start, shared by the threads of one product); 0 when none
 * is left. Guided: a quarter of the rows left, in whole units of UNIT_ROWS (at least one),
 * so each thread reads long runs of consecutive rows: the rows PREFETCH_ROWS ahead are its
 * own (with units of 16 rows handed out one by one, they were mostly the other thread's,
 * prefetched into the wrong core's caches), and the takes shrink towards the end, so the
 * threads still finish together. Which thread computes a row never changes its result. */
static inline int take_rows(int64_t *next, int64_t N, int64_t *n0, int64_t *nt)
{
    int64_t start = __atomic_load_n(next, __ATOMIC_RELAXED);
    for (;;) {
        if (start >= N) return 0;
        int64_t chunk = (N - start) / 4 / UNIT_ROWS * UNIT_ROWS;
        if (chunk < UNIT_ROWS) chunk = UNIT_ROWS;
        if (__atomic_compare_exchange_n(next, &start, start + chunk, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *n0 = start;
            *nt = N - start < chunk ? N - start : chunk;
            return 1;
        }
    }
}

/* ---- block formats ------------------------------------------------------ */

/* (static: an exported function is not inlined under -fPIC, and these must fold
 * to constants in the kernels) */
static inline int block_elems(int type)
{
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q8_0: case T_F32: case T_F16: case T_BF16: return 32;
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
    case T_F32: return 128;
    case T_F16: case T_BF16: return 64;
    default: return 0;
    }
}

int quant_best_isa(void);

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

/* bfloat16 to float: the upper half of the float's bits (exact). */
INLINE float bf16_to_f32(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void put(float *y, float v, int accumulate) { *y = accumulate ? *y + v : v; }

/* ---- shared between the sources (quant_dequant.c, quant_epilogue.c) ------ */

/* `n` consecutive blocks at `b` -> n * block_elems floats at `y`. */
typedef void (*dequant_fn)(int type, const uint8_t *b, int64_t n, float *y);
/* Rows 0..M of y, columns n0..n0+nt: + bias, then the fused op (OP_*) with `other`. */
typedef void (*epilogue_fn)(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                            const float *bias, int op, const float *other);

HIDDEN void dequant_scalar(int type, const uint8_t *b, int64_t n, float *y);
HIDDEN void epilogue_scalar(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                            const float *bias, int op, const float *other);
#if QM_X86
HIDDEN void dequant_avx2(int type, const uint8_t *b, int64_t n, float *y);
HIDDEN void dequant_avx512(int type, const uint8_t *b, int64_t n, float *y);
HIDDEN void epilogue_avx2(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                          const float *bias, int op, const float *other);
HIDDEN void epilogue_avx512(float *y, int64_t M, int64_t N, int64_t n0, int64_t nt,
                            const float *bias, int op, const float *other);
#endif
/* The dequantizer for instruction-set level `isa` (capped at quant_best_isa()). */
HIDDEN dequant_fn dequant_for(int isa);
/* The epilogue for instruction-set level `isa` (capped at quant_best_isa()). */
HIDDEN epilogue_fn epilogue_for(int isa);

/* M rows of K activations quantized to 8 bits per 32-block (quant_act8.c): block j of
 * row m is q[m * K + 32 j ...] * d[m * K / 32 + j], and s[...] = d * (the sum of its q). */
struct act8 {
    int8_t *q;
    float *d, *s;
};
/* The bytes `act8_bind` lays M rows of K values out in. */
static inline int64_t act8_bytes(int64_t M, int64_t K) { return M * K + 2 * (M * K / 32) * 4; }
/* An act8 over `buf` (act8_bytes(M, K) bytes, 4-byte aligned). */
static inline struct act8 act8_bind(void *buf, int64_t M, int64_t K)
{
    struct act8 a;
    a.q = (int8_t *)buf;
    a.d = (float *)(a.q + M * K);
    a.s = a.d + M * K / 32;
    return a;
}
/* Quantizes x [M, K] (K a multiple of 32) into `a`, bit for bit the same on every path. */
HIDDEN void act8_quantize(const float *x, int64_t M, int64_t K, struct act8 a, int isa);

/* y[0:M, 0:nt] = x . W[0:nt]^T for nt rows of W (stride row_bytes), x quantized in `a`
 * (quant_dot8.c: integer dot products, the same result bit for bit on every path). */
typedef void (*dot8_fn)(struct act8 a, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes,
                        int64_t nt, float *y, int64_t ldy, int type);
HIDDEN void dot8_scalar(struct act8 a, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes,
                        int64_t nt, float *y, int64_t ldy, int type);
#if QM_X86
HIDDEN void dot8_avx2(struct act8 a, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes,
                      int64_t nt, float *y, int64_t ldy, int type);
HIDDEN void dot8_vnni(struct act8 a, int64_t M, int64_t K, const uint8_t *w, int64_t row_bytes,
                      int64_t nt, float *y, int64_t ldy, int type);
#endif

#endif
