/* Per-row (per-token) pieces of the kernels that the decode program (decode_program.c)
 * calls one row at a time: the same functions the whole-tensor kernels call, never
 * inlined, so a row computed by either is bit-identical. */
#ifndef OMNISTAGE_KERNEL_ROWS_H
#define OMNISTAGE_KERNEL_ROWS_H

#include <stdint.h>
#include <string.h>

/* Row-wise kernels (norms, rotary + KV write) go parallel only from this many floats:
 * smaller ones take ~0.1 ms or less on one thread, less than waking an OpenMP team on
 * cores the kernels' own pool is using between products (docs/performance.md). */
#define PARALLEL_ROW_FLOATS (1 << 18)

/* `num_threads` if `floats` is worth a team, else 1. */
static inline int row_threads(int64_t floats, int num_threads)
{
    return floats >= PARALLEL_ROW_FLOATS ? num_threads : 1;
}

/* Whether *x is NaN, from its bits: the libraries are built with -ffinite-math-only, under
 * which isnan() may be folded away. */
static inline int nan_bits(const float *x)
{
    uint32_t bits;
    memcpy(&bits, x, sizeof bits);
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

/* Whether x[0..n) holds a NaN (a reduction that vectorizes: no early exit). */
static inline int any_nan(const float *x, int64_t n)
{
    int nan = 0;
    for (int64_t i = 0; i < n; i++) nan |= nan_bits(x + i);
    return nan;
}

/* rms_norm.c: o = weight * x / sqrt(mean(x^2) + eps) over `dim` values. */
void rms_norm_row_f32(const float *x, const float *weight, float *o, int64_t dim, float eps);

/* rms_norm.c: the q heads then the k heads at the start of one qkv row, each normalised
 * in place by `rms_norm_row_f32` with its own weight. */
void qk_norm_row_f32(float *row, int64_t heads, int64_t kv_heads, int64_t head_dim,
                     const float *q_weight, const float *k_weight, float eps);

/* rope_cache.c: rotate one token's q and k heads in place, copy its k, v to `slot`. */
void rope_write_kv_token_f32(float *x, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             int64_t position, const float *cos_table, const float *sin_table,
                             float *kv_cache, int64_t num_slots, int64_t slot);

/* paged_attention.c: decode attention with q rows `q_stride` floats apart. */
void paged_decode_attention_strided_f32(const float *q, int64_t q_stride, const float *kv,
                                        const int64_t *block_table, const int64_t *seq_lens,
                                        float *out, int64_t batch, int64_t heads, int64_t kv_heads,
                                        int64_t head_dim, int64_t num_blocks, int64_t block_size,
                                        int64_t max_blocks, float scale, int64_t *next_unit);

/* sample_race.c: the sampler's `row_seed` key of (seed, output position). */
uint64_t race_row_key(uint64_t seed, uint64_t position);

/* sample_race.c: one row's exponential-race draw at temperature t with top-k k. */
int64_t race_sample_row_f32(const float *x, int64_t vocab, float t, int64_t k, uint64_t key,
                            float *scratch);

#endif
