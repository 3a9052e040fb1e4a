/* Paged decode attention for the CPU: one query token per sequence, keys and
 * values read in place from the block pool (no gather copy).
 *
 * kv cache layout: [2][kv_heads][num_blocks][block_size][head_dim], float32 or bfloat16
 * (`_bf16`: each block's rows widened to float32 on the stack before the same walk;
 * queries and outputs are float32 either way).
 * For each (sequence, kv head) — a "unit" — the group of query heads sharing
 * that KV head walks the sequence's blocks with an online softmax, one block at
 * a time: scores of the block, block max, rescale, exponentials, weighted
 * values. The next block is prefetched into L2 while one is computed (blocks of
 * a sequence are scattered over the pool: without it the walk waits on memory;
 * into L1, the block's 128 prefetches held L1's few miss buffers: 14 % slower).
 * With AVX-512 and head_dim, block_size multiples of 16, a block's scores are
 * 16 products reduced together (one transpose-add tree instead of 16
 * horizontal sums) and the weighted values in register tiles of up to 4
 * query heads by 64 values (each value row loaded once per tile, the
 * accumulators never stored in between); elsewhere, and for every block's
 * softmax (exp_vec.h's exp, not libm's), plain loops the compiler vectorizes
 * (built with reassociation allowed; no infinities are used, so finite-math is
 * safe).
 *
 * Work sharing: callers on several threads pass the same counter (zero at the
 * start); each takes the next few units from it until none is left, so the
 * threads finish together even when one of them is descheduled. With few
 * (sequence, kv head) pairs (a decode of one sequence: SmolLM2 has 3 KV heads)
 * units are taken one at a time (taken four at a time, one thread took all three
 * and the other waited), and a single pair is split into one unit per query head
 * (each query head's arithmetic is the same whichever heads of its group are
 * computed with it, so a split never changes a result; more pairs are not split:
 * each thread reading a pair's keys and values would read them twice, and at
 * decode the walk is bound by reading them). No OpenMP
 * team: nothing spins after the call (a spinning team would take the core
 * the engine process needs under asynchronous scheduling).
 */
#include "bf16.h"
#include "exp_vec.h"
#include "kernel_rows.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

#define MAX_GROUP 16
#define MAX_BLOCK 128
#define MAX_DIM 256
#define UNITS_PER_TAKE 4 /* with many units */
#define FEW_PAIRS 16     /* fewer (sequence, kv head) pairs than this: taken one at a time */

static inline float dot(const float *restrict a, const float *restrict b, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

int paged_decode_limits_ok(int64_t group, int64_t block_size, int64_t head_dim)
{
    return group <= MAX_GROUP && block_size <= MAX_BLOCK && head_dim <= MAX_DIM;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* Lane t of the result: the sum of the lanes of v[t]. */
static inline __m512 sum_lanes16(const __m512 v[16])
{
    __m512 w[8], x[4];
    for (int i = 0; i < 8; i++)
        w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int j = 0; j < 4; j++) {
        const __m512d a = _mm512_castps_pd(w[2 * j]), b = _mm512_castps_pd(w[2 * j + 1]);
        x[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 p01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88),
                                     _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
    const __m512 p23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x88),
                                     _mm512_shuffle_f32x4(x[2], x[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(p01, p23, 0x88), _mm512_shuffle_f32x4(p01, p23, 0xDD));
}

/* Scaled scores of one query row against up to 16 keys (head_dim a multiple of 16). */
static inline void scores16(const float *qg, const float *keys, int64_t n, int64_t head_dim,
                            float scale, float *out)
{
    __m512 v[16];
    for (int64_t t = 0; t < 16; t++) {
        if (t < n) {
            const float *k = keys + t * head_dim;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_loadu_ps(k));
            for (int64_t c = 16; c < head_dim; c += 16)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + c), _mm512_loadu_ps(k + c), acc);
            v[t] = acc;
        } else {
            v[t] = _mm512_setzero_ps();
        }
    }
    _mm512_storeu_ps(out, _mm512_mul_ps(sum_lanes16(v), _mm512_set1_ps(scale)));
}
/* acc[g0 + g][c0 : c0 + 16 NC] = acc * corr + sum_t p[g0 + g][t] * v[t][same], g < NG: the
 * NG x NC accumulators stay in registers while the block's value rows pass (each row
 * loaded once for the NG heads); per lane the same multiply, then the same FMAs in t
 * order, as one accumulator at a time in memory would do. */
static inline __attribute__((always_inline)) void values_tile(
    float acc[][MAX_DIM], float p[][MAX_BLOCK], const float *corr, const float *vb, int64_t n,
    int64_t head_dim, int64_t g0, int64_t c0, const int NG, const int NC)
{
    __m512 a[4][4];
    for (int g = 0; g < NG; g++)
        for (int c = 0; c < NC; c++)
            a[g][c] = _mm512_mul_ps(_mm512_loadu_ps(acc[g0 + g] + c0 + 16 * c),
                                    _mm512_set1_ps(corr[g0 + g]));
    for (int64_t t = 0; t < n; t++) {
        __m512 v[4];
        for (int c = 0; c < NC; c++) v[c] = _mm512_loadu_ps(vb + t * head_dim + c0 + 16 * c);
        for (int g = 0; g < NG; g++) {
            const __m512 pg = _mm512_set1_ps(p[g0 + g][t]);
            for (int c = 0; c < NC; c++) a[g][c] = _mm512_fmadd_ps(pg, v[c], a[g][c]);
        }
    }
    for (int g = 0; g < NG; g++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(acc[g0 + g] + c0 + 16 * c, a[g][c]);
}

/* acc[g] = acc[g] * corr[g] + sum_t p[g][t] * v[t] (head_dim a multiple of 16), in tiles
 * of up to 4 heads by 64 values. */
static inline void weighted_values16(float acc[][MAX_DIM], float p[][MAX_BLOCK], const float *corr,
                                     const float *vb, int64_t n, int64_t group, int64_t head_dim)
{
    for (int64_t g0 = 0; g0 < group; g0 += 4)
        for (int64_t c0 = 0; c0 < head_dim;) {
            const int wide = head_dim - c0 >= 64; /* else one 16-value column at a time */
            switch ((group - g0 < 4 ? group - g0 : 4) * 2 + wide) {
            case 2: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 1, 1); break;
            case 3: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 1, 4); break;
            case 4: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 2, 1); break;
            case 5: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 2, 4); break;
            case 6: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 3, 1); break;
            case 7: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 3, 4); break;
            case 8: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 4, 1); break;
            default: values_tile(acc, p, corr, vb, n, head_dim, g0, c0, 4, 4); break;
            }
            c0 += wide ? 64 : 16;
        }
}
#define HAVE_SCORES16 1
#else
#define HAVE_SCORES16 0
#endif

static inline void prefetch_block(const char *k, const char *v, int64_t bytes)
{
    for (int64_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch(k + o, 0, 2);
        __builtin_prefetch(v + o, 0, 2);
    }
}

/* The walk over a float32 (`kv_bf16` 0) or bfloat16 (1) cache; `q` rows `q_stride` floats
 * apart (the decode program reads q inside the qkv rows). */
static __attribute__((noinline)) void decode_walk(
    const float *q, int64_t q_stride, const void *kv, int kv_bf16, const int64_t *block_table,
    const int64_t *seq_lens, float *out, int64_t batch, int64_t heads, int64_t kv_heads,
    int64_t head_dim, int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale,
    int64_t *next_unit)
{
    const int64_t group = heads / kv_heads;
    const int64_t elem = kv_bf16 ? 2 : 4;
    const int64_t plane = num_blocks * block_size * head_dim; /* one kv head's pool */
    const int64_t block_floats = block_size * head_dim;
    const int64_t block_bytes = block_floats * elem;
    const char *keys = kv;
    const char *values = keys + kv_heads * plane * elem;
    const int fast_scores = HAVE_SCORES16 && head_dim % 16 == 0 && block_size % 16 == 0;
    const int64_t pairs = batch * kv_heads;
    const int64_t split = pairs == 1 ? group : 1; /* units per pair */
    const int64_t units = pairs * split, per_take = pairs < FEW_PAIRS ? 1 : UNITS_PER_TAKE;
    const int64_t heads_per_unit = group / split;

    for (;;) {
        const int64_t first = __atomic_fetch_add(next_unit, per_take, __ATOMIC_RELAXED);
        if (first >= units) break;
        const int64_t last = first + per_take < units ? first + per_take : units;
        for (int64_t u = first; u < last; u++) {
            const int64_t pair = u / split, b = pair / kv_heads, h = pair % kv_heads;
            const int64_t head0 = h * group + (u % split) * heads_per_unit; /* first q head */
            const float *qg = q + b * q_stride + head0 * head_dim;
            float *og = out + (b * heads + head0) * head_dim;
            const char *kh = keys + h * plane * elem, *vh = values + h * plane * elem;
            float kbuf[kv_bf16 ? block_floats : 1], vbuf[kv_bf16 ? block_floats : 1];
            const int64_t *table = block_table + b * max_blocks;
            float m[MAX_GROUP], l[MAX_GROUP];
            float s[MAX_GROUP][MAX_BLOCK];
            float acc[MAX_GROUP][MAX_DIM];
            for (int64_t g = 0; g < heads_per_unit; g++) {
                m[g] = -FLT_MAX;
                l[g] = 0.0f;
                for (int64_t d = 0; d < head_dim; d++) acc[g][d] = 0.0f;
            }
            const int64_t len = seq_lens[b];
            const int64_t nblk = (len + block_size - 1) / block_size;
            for (int64_t blk = 0; blk < nblk; blk++) {
                const char *kraw = kh + table[blk] * block_bytes;
                const char *vraw = vh + table[blk] * block_bytes;
                if (blk + 1 < nblk)
                    prefetch_block(kh + table[blk + 1] * block_bytes, vh + table[blk + 1] * block_bytes,
                                   block_bytes);
                const int64_t left = len - blk * block_size;
                const int64_t n = left < block_size ? left : block_size;
                const float *kb = (const float *)kraw, *vb = (const float *)vraw;
                if (kv_bf16) {
                    widen_bf16((const uint16_t *)kraw, kbuf, n * head_dim);
                    widen_bf16((const uint16_t *)vraw, vbuf, n * head_dim);
                    kb = kbuf;
                    vb = vbuf;
                }
#if HAVE_SCORES16
                if (fast_scores) {
                    for (int64_t g = 0; g < heads_per_unit; g++)
                        for (int64_t t0 = 0; t0 < n; t0 += 16)
                            scores16(qg + g * head_dim, kb + t0 * head_dim, n - t0, head_dim, scale,
                                     s[g] + t0);
                } else
#endif
                {
                    for (int64_t t = 0; t < n; t++)
                        for (int64_t g = 0; g < heads_per_unit; g++)
                            s[g][t] = dot(qg + g * head_dim, kb + t * head_dim, head_dim) * scale;
                }
                float corr[MAX_GROUP];
                for (int64_t g = 0; g < heads_per_unit; g++) {
                    float bmax = m[g];
                    for (int64_t t = 0; t < n; t++) bmax = s[g][t] > bmax ? s[g][t] : bmax;
                    corr[g] = expf(m[g] - bmax);
                    float sum = 0.0f;
                    for (int64_t t = 0; t < n; t++) { /* vectorizes: exp_vec, not libm's */
                        s[g][t] = exp_vec(s[g][t] - bmax);
                        sum += s[g][t];
                    }
                    l[g] = l[g] * corr[g] + sum;
                    m[g] = bmax;
                }
#if HAVE_SCORES16
                if (fast_scores) {
                    weighted_values16(acc, s, corr, vb, n, heads_per_unit, head_dim);
                    continue;
                }
#endif
                for (int64_t g = 0; g < heads_per_unit; g++) {
                    float *ag = acc[g];
                    for (int64_t d = 0; d < head_dim; d++) ag[d] *= corr[g];
                    for (int64_t t = 0; t < n; t++) {
                        const float p = s[g][t];
                        const float *vt = vb + t * head_dim;
                        for (int64_t d = 0; d < head_dim; d++) ag[d] += p * vt[d];
                    }
                }
            }
            for (int64_t g = 0; g < heads_per_unit; g++) {
                const float inv = 1.0f / l[g];
                for (int64_t d = 0; d < head_dim; d++) og[g * head_dim + d] = acc[g][d] * inv;
            }
        }
    }
}

__attribute__((noinline)) void paged_decode_attention_strided_f32(
    const float *q, int64_t q_stride, const float *kv, const int64_t *block_table,
    const int64_t *seq_lens, float *out, int64_t batch, int64_t heads, int64_t kv_heads,
    int64_t head_dim, int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale,
    int64_t *next_unit)
{
    decode_walk(q, q_stride, kv, 0, block_table, seq_lens, out, batch, heads, kv_heads, head_dim,
                num_blocks, block_size, max_blocks, scale, next_unit);
}

void paged_decode_attention_f32(
    const float *q, const float *kv, const int64_t *block_table, const int64_t *seq_lens,
    float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale, int64_t *next_unit)
{
    decode_walk(q, heads * head_dim, kv, 0, block_table, seq_lens, out, batch, heads, kv_heads,
                head_dim, num_blocks, block_size, max_blocks, scale, next_unit);
}

/* The same over a bfloat16 cache (float32 queries and outputs). */
void paged_decode_attention_bf16(
    const float *q, const uint16_t *kv, const int64_t *block_table, const int64_t *seq_lens,
    float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale, int64_t *next_unit)
{
    decode_walk(q, heads * head_dim, kv, 1, block_table, seq_lens, out, batch, heads, kv_heads,
                head_dim, num_blocks, block_size, max_blocks, scale, next_unit);
}

/* The same on an OpenMP team of `num_threads` (the pool torch computes on, when it has
 * more than one thread: that pool's threads are awake between ops anyway). */
void paged_decode_attention_f32_team(
    const float *q, const float *kv, const int64_t *block_table, const int64_t *seq_lens,
    float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale, int num_threads)
{
    int64_t next_unit = 0;
#pragma omp parallel num_threads(num_threads)
    paged_decode_attention_f32(q, kv, block_table, seq_lens, out, batch, heads, kv_heads, head_dim,
                               num_blocks, block_size, max_blocks, scale, &next_unit);
}

void paged_decode_attention_bf16_team(
    const float *q, const uint16_t *kv, const int64_t *block_table, const int64_t *seq_lens,
    float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale, int num_threads)
{
    int64_t next_unit = 0;
#pragma omp parallel num_threads(num_threads)
    paged_decode_attention_bf16(q, kv, block_table, seq_lens, out, batch, heads, kv_heads,
                                head_dim, num_blocks, block_size, max_blocks, scale, &next_unit);
}
