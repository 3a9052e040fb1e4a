/* Rotary embedding and KV-cache write in one pass over the qkv projection output.
 *
 * qkv: [tokens][heads + 2 * kv_heads][head_dim] (float32, contiguous): q heads,
 * then k heads, then v heads. Rotates q and k in place (neox style: the two
 * halves of each head are the pair), then copies k and v of every token to its
 * slot in the cache [2][kv_heads][num_blocks * block_size][head_dim].
 * cos/sin: [max_positions][head_dim] tables (halves duplicated, as transformers builds them).
 * One token is `rope_write_kv_token_f32`, which the decode program calls too.
 *
 * `rope_write_kv_bf16` does the same on bfloat16 qkv rows, tables and cache: each rotated
 * value computed in float32 from the bfloat16 inputs and rounded once.
 */
#include "bf16.h"
#include "kernel_rows.h"

#include <string.h>

__attribute__((noinline)) void rope_write_kv_token_f32(float *x, int64_t heads, int64_t kv_heads,
                                                        int64_t head_dim, int64_t position,
                                                        const float *cos_table,
                                                        const float *sin_table, float *kv_cache,
                                                        int64_t num_slots, int64_t slot)
{
    const int64_t half = head_dim / 2;
    const int64_t plane = num_slots * head_dim;
    const float *c = cos_table + position * head_dim;
    const float *s = sin_table + position * head_dim;
    for (int64_t h = 0; h < heads + kv_heads; h++) {
        float *a = x + h * head_dim;
        float *b = a + half;
        for (int64_t i = 0; i < half; i++) {
            const float x1 = a[i], x2 = b[i];
            a[i] = x1 * c[i] - x2 * s[i];
            b[i] = x2 * c[half + i] + x1 * s[half + i];
        }
    }
    for (int64_t h = 0; h < kv_heads; h++) {
        memcpy(kv_cache + h * plane + slot * head_dim, x + (heads + h) * head_dim,
               head_dim * sizeof(float));
        memcpy(kv_cache + (kv_heads + h) * plane + slot * head_dim,
               x + (heads + kv_heads + h) * head_dim, head_dim * sizeof(float));
    }
}

void rope_write_kv_f32(
    float *qkv, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
    const int64_t *positions, const float *cos_table, const float *sin_table,
    float *kv_cache, int64_t num_slots, const int64_t *slots, int num_threads)
{
    const int64_t row = (heads + 2 * kv_heads) * head_dim;
#pragma omp parallel for schedule(static) num_threads(row_threads(tokens * row, num_threads))
    for (int64_t t = 0; t < tokens; t++)
        rope_write_kv_token_f32(qkv + t * row, heads, kv_heads, head_dim, positions[t], cos_table,
                                sin_table, kv_cache, num_slots, slots[t]);
}

static void rope_write_kv_token_bf16(uint16_t *x, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, int64_t position, const uint16_t *cos_table,
                                     const uint16_t *sin_table, uint16_t *kv_cache,
                                     int64_t num_slots, int64_t slot)
{
    const int64_t half = head_dim / 2;
    const int64_t plane = num_slots * head_dim;
    const uint16_t *c = cos_table + position * head_dim;
    const uint16_t *s = sin_table + position * head_dim;
    for (int64_t h = 0; h < heads + kv_heads; h++) {
        uint16_t *a = x + h * head_dim;
        uint16_t *b = a + half;
        for (int64_t i = 0; i < half; i++) {
            const float x1 = bf16_to_f32(a[i]), x2 = bf16_to_f32(b[i]);
            a[i] = f32_to_bf16(x1 * bf16_to_f32(c[i]) - x2 * bf16_to_f32(s[i]));
            b[i] = f32_to_bf16(x2 * bf16_to_f32(c[half + i]) + x1 * bf16_to_f32(s[half + i]));
        }
    }
    for (int64_t h = 0; h < kv_heads; h++) {
        memcpy(kv_cache + h * plane + slot * head_dim, x + (heads + h) * head_dim,
               head_dim * sizeof(uint16_t));
        memcpy(kv_cache + (kv_heads + h) * plane + slot * head_dim,
               x + (heads + kv_heads + h) * head_dim, head_dim * sizeof(uint16_t));
    }
}

void rope_write_kv_bf16(
    uint16_t *qkv, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
    const int64_t *positions, const uint16_t *cos_table, const uint16_t *sin_table,
    uint16_t *kv_cache, int64_t num_slots, const int64_t *slots, int num_threads)
{
    const int64_t row = (heads + 2 * kv_heads) * head_dim;
#pragma omp parallel for schedule(static) num_threads(row_threads(tokens * row, num_threads))
    for (int64_t t = 0; t < tokens; t++)
        rope_write_kv_token_bf16(qkv + t * row, heads, kv_heads, head_dim, positions[t], cos_table,
                                 sin_table, kv_cache, num_slots, slots[t]);
}
