/* Paged decode attention for the CPU: one query token per sequence, keys and
 * values read in place from the block pool (no gather copy).
 *
 * kv cache layout: [2][kv_heads][num_blocks][block_size][head_dim] (float32).
 * For each (sequence, kv head) the group of query heads sharing that KV head
 * walks the sequence's blocks with an online softmax, one block at a time:
 * scores of the block, block max, rescale, exponentials, weighted values.
 * Loops are written so the compiler vectorizes them (built with reassociation
 * allowed); no infinities are used, so finite-math is safe.
 * Parallel over (sequence, kv head) with OpenMP.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#define MAX_GROUP 16
#define MAX_BLOCK 128
#define MAX_DIM 256

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

void paged_decode_attention_f32(
    const float *q, const float *kv, const int64_t *block_table, const int64_t *seq_lens,
    float *out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale, int num_threads)
{
    const int64_t group = heads / kv_heads;
    const int64_t plane = num_blocks * block_size * head_dim; /* one kv head's pool */
    const float *keys = kv;
    const float *values = kv + kv_heads * plane;

#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(num_threads)
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < kv_heads; h++) {
            const float *qg = q + (b * heads + h * group) * head_dim;
            float *og = out + (b * heads + h * group) * head_dim;
            float m[MAX_GROUP], l[MAX_GROUP];
            float s[MAX_GROUP][MAX_BLOCK];
            float acc[MAX_GROUP][MAX_DIM];
            for (int64_t g = 0; g < group; g++) {
                m[g] = -FLT_MAX;
                l[g] = 0.0f;
                for (int64_t d = 0; d < head_dim; d++) acc[g][d] = 0.0f;
            }
            const int64_t len = seq_lens[b];
            const int64_t nblk = (len + block_size - 1) / block_size;
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t bid = block_table[b * max_blocks + blk];
                const float *kb = keys + h * plane + bid * block_size * head_dim;
                const float *vb = values + h * plane + bid * block_size * head_dim;
                const int64_t left = len - blk * block_size;
                const int64_t n = left < block_size ? left : block_size;
                for (int64_t t = 0; t < n; t++) {
                    for (int64_t g = 0; g < group; g++) s[g][t] = dot(qg + g * head_dim, kb + t * head_dim, head_dim) * scale;
                }
                for (int64_t g = 0; g < group; g++) {
                    float bmax = m[g];
                    for (int64_t t = 0; t < n; t++) bmax = s[g][t] > bmax ? s[g][t] : bmax;
                    const float corr = expf(m[g] - bmax);
                    float sum = 0.0f;
                    for (int64_t t = 0; t < n; t++) {
                        s[g][t] = expf(s[g][t] - bmax);
                        sum += s[g][t];
                    }
                    l[g] = l[g] * corr + sum;
                    m[g] = bmax;
                    float *ag = acc[g];
                    for (int64_t d = 0; d < head_dim; d++) ag[d] *= corr;
                    for (int64_t t = 0; t < n; t++) {
                        const float p = s[g][t];
                        const float *vt = vb + t * head_dim;
                        for (int64_t d = 0; d < head_dim; d++) ag[d] += p * vt[d];
                    }
                }
            }
            for (int64_t g = 0; g < group; g++) {
                const float inv = 1.0f / l[g];
                for (int64_t d = 0; d < head_dim; d++) og[g * head_dim + d] = acc[g][d] * inv;
            }
        }
    }
}
