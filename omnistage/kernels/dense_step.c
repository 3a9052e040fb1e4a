/* One step of a small dense decoder over short, independent sequences, in one call.
 *
 * A multi-codebook talker's code predictor (Qwen3-Omni, Qwen3-TTS) runs its decoder 15
 * times per frame over a fresh per-frame sequence of at most 17 positions; from torch a
 * step is ~40 small ops per layer, whose call overhead, not arithmetic, is the cost on a
 * small model (docs/performance.md). Here a step is one call: every layer (RMSNorm, the
 * fused q/k/v product, per-head q/k RMSNorm, neox rotary, the write of k and v to the
 * row's cache, causal attention over the row's positions, o product + residual, RMSNorm,
 * fused gate/up product, silu * up, down product + residual), after the input's
 * projection where the model has one, then the final RMSNorm of
 * each row's last position and its head product (the logits).
 *
 * Layout (float32, contiguous): input rows [rows][t][in_width] of positions
 * start..start+t-1 of every row (first projected to the hidden width where a projection
 * is given: Qwen3-TTS 1.7B's `small_to_mtp_projection`); cache
 * [rows][layers][2][kv_heads][max_len][head_dim]; cos/sin [max_len][head_dim] (halves
 * duplicated, as transformers builds them); weights as torch's Linear holds them
 * ([out][in]); logits [rows][vocab].
 *
 * Products loop over the weight's rows outside and the input rows inside, so a batch
 * reads each weight row once; every output value is one `dot` over `in` values in one
 * order, computed by one thread, whatever the number of rows or threads: a row's result
 * is the same alone or in any batch (and with any thread count). Threads share a
 * product's weight rows only when the product is large enough to pay for the team.
 */
#include "kernel_rows.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct dense_layer {
    const float *input_norm, *qkv_w, *qkv_b, *q_norm, *k_norm, *o_w, *o_b, *post_norm,
        *gate_up_w, *down_w;
};

struct dense_shape {
    int64_t hidden, heads, kv_heads, head_dim, intermediate, layers, max_len, vocab, in_width;
    double eps, scale;
};

__attribute__((noinline)) static float dot(const float *a, const float *b, int64_t n)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

/* Four outputs of one input row: x . w[0..3] (rows `in` apart), each summed as `dot`
 * would be by itself; one call instead of four where the products are short. */
__attribute__((noinline)) static void dot4(const float *x, const float *w, int64_t n, float *out)
{
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        s0 += x[i] * w[i];
        s1 += x[i] * w[n + i];
        s2 += x[i] * w[2 * n + i];
        s3 += x[i] * w[3 * n + i];
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

static void rms_norm(const float *x, const float *w, float *o, int64_t n, float eps)
{
    const float scale = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        o[i] = w[i] * (x[i] * scale);
}

/* y[m][n] = x[m] . w[n] (+ b[n]) (+ y[m][n] when `accumulate`): the residual adds.
 * Output n is summed by `dot4` for n < out - out % 4, else by `dot`: which one depends on
 * n and `out` only, never on m or the thread. */
static void product(const float *x, int64_t m, int64_t in, const float *w, const float *b,
                    int64_t out, float *y, int accumulate, int threads)
{
    const int team = m * out * in >= (1 << 20) ? threads : 1;
    const int64_t quads = out / 4;
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t q = 0; q < quads + out % 4; q++) {
        const int64_t n = q < quads ? 4 * q : 4 * quads + (q - quads), width = q < quads ? 4 : 1;
        for (int64_t r = 0; r < m; r++) {
            float v[4];
            if (width == 4)
                dot4(x + r * in, w + n * in, in, v);
            else
                v[0] = dot(x + r * in, w + n * in, in);
            for (int64_t k = 0; k < width; k++) {
                const float e = b ? v[k] + b[n + k] : v[k];
                float *o = y + r * out + n + k;
                *o = accumulate ? *o + e : e;
            }
        }
    }
}

/* q/k RMSNorm and rotary of one position's qkv row, k and v written to the row's cache. */
static void qk_rotary_cache(float *qkv, const struct dense_shape *s, const struct dense_layer *l,
                            int64_t pos, const float *cos_t, const float *sin_t, float *kv)
{
    const int64_t d = s->head_dim, half = d / 2, plane = s->max_len * d;
    const float *c = cos_t + pos * d, *sn = sin_t + pos * d;
    for (int64_t h = 0; h < s->heads + s->kv_heads; h++) {
        float *a = qkv + h * d;
        rms_norm(a, h < s->heads ? l->q_norm : l->k_norm, a, d, (float)s->eps);
        for (int64_t i = 0; i < half; i++) {
            const float x1 = a[i], x2 = a[half + i];
            a[i] = x1 * c[i] - x2 * sn[i];
            a[half + i] = x2 * c[half + i] + x1 * sn[half + i];
        }
    }
    for (int64_t h = 0; h < s->kv_heads; h++) {
        memcpy(kv + h * plane + pos * d, qkv + (s->heads + h) * d, d * sizeof(float));
        memcpy(kv + (s->kv_heads + h) * plane + pos * d, qkv + (s->heads + s->kv_heads + h) * d,
               d * sizeof(float));
    }
}

/* Attention of one position's q heads over the row's positions 0..pos. */
static void attend(const float *qkv, const struct dense_shape *s, const float *kv, int64_t pos,
                   float *out, float *scores)
{
    const int64_t d = s->head_dim, plane = s->max_len * d, group = s->heads / s->kv_heads;
    for (int64_t h = 0; h < s->heads; h++) {
        const float *k = kv + (h / group) * plane, *v = kv + (s->kv_heads + h / group) * plane;
        float top = -FLT_MAX, total = 0.0f; /* no infinities: built -ffinite-math-only */
        for (int64_t p = 0; p <= pos; p++) {
            scores[p] = dot(qkv + h * d, k + p * d, d) * (float)s->scale;
            top = scores[p] > top ? scores[p] : top;
        }
        for (int64_t p = 0; p <= pos; p++)
            total += scores[p] = expf(scores[p] - top);
        float *o = out + h * d;
        memset(o, 0, d * sizeof(float));
        for (int64_t p = 0; p <= pos; p++) {
            const float w = scores[p] / total;
            for (int64_t i = 0; i < d; i++)
                o[i] += w * v[p * d + i];
        }
    }
}

static void layer_step(const struct dense_layer *l, int64_t li, const struct dense_shape *s,
                       float *x, int64_t rows, int64_t t, int64_t start, float *cache,
                       const float *cos_t, const float *sin_t, float *scratch, int threads)
{
    const int64_t m = rows * t, hid = s->hidden, d = s->head_dim;
    const int64_t qkv_w = (s->heads + 2 * s->kv_heads) * d, att_w = s->heads * d;
    const int64_t row_cache = s->layers * 2 * s->kv_heads * s->max_len * d;
    const int64_t att_size = att_w > s->intermediate ? att_w : s->intermediate;
    float *h = scratch, *qkv = h + m * hid, *att = qkv + m * qkv_w, *gu = att + m * att_size;
    float *scores = gu + m * 2 * s->intermediate;
    for (int64_t r = 0; r < m; r++)
        rms_norm(x + r * hid, l->input_norm, h + r * hid, hid, (float)s->eps);
    product(h, m, hid, l->qkv_w, l->qkv_b, qkv_w, qkv, 0, threads);
    for (int64_t r = 0; r < m; r++) {
        float *kv = cache + (r / t) * row_cache + li * 2 * s->kv_heads * s->max_len * d;
        qk_rotary_cache(qkv + r * qkv_w, s, l, start + r % t, cos_t, sin_t, kv);
    }
    for (int64_t r = 0; r < m; r++) {
        const float *kv = cache + (r / t) * row_cache + li * 2 * s->kv_heads * s->max_len * d;
        attend(qkv + r * qkv_w, s, kv, start + r % t, att + r * att_w, scores);
    }
    product(att, m, att_w, l->o_w, l->o_b, hid, x, 1, threads);
    for (int64_t r = 0; r < m; r++)
        rms_norm(x + r * hid, l->post_norm, h + r * hid, hid, (float)s->eps);
    const int64_t inter = s->intermediate;
    product(h, m, hid, l->gate_up_w, NULL, 2 * inter, gu, 0, threads);
    for (int64_t r = 0; r < m; r++) {
        float *g = gu + r * 2 * inter, *a = att + r * inter; /* att is dead: reuse it */
        for (int64_t i = 0; i < inter; i++)
            a[i] = g[i] / (1.0f + expf(-g[i])) * g[inter + i];
    }
    product(att, m, inter, l->down_w, NULL, hid, x, 1, threads);
}

/* Floats of scratch a step of `m` positions needs (the caller need not provide it). */
static int64_t scratch_floats(const struct dense_shape *s, int64_t m)
{
    const int64_t att = s->heads * s->head_dim > s->intermediate ? s->heads * s->head_dim
                                                                 : s->intermediate;
    return m * (2 * s->hidden + (s->heads + 2 * s->kv_heads) * s->head_dim + att +
                2 * s->intermediate) +
           s->max_len;
}

/* Positions start..start+t-1 of every row: `in` [rows][t][in_width] (projected to the
 * hidden width by proj_w [hidden][in_width] + proj_b when proj_w is not NULL, else
 * in_width == hidden) -> logits [rows][vocab] of each row's last position.
 * `in` NULL: the rows are those of the embedding `table` [table_rows][in_width] at `ids`
 * [rows][t] (the code a row just drew, looked up here instead of by a torch call).
 * Returns 0, -1 when scratch memory could not be had, -2 when an id is outside the table
 * (nothing computed then). */
int dense_step_f32(const struct dense_layer *layers, const struct dense_shape *s, const float *in,
                   const int64_t *ids, const float *table, int64_t table_rows, int64_t rows,
                   int64_t t, int64_t start, float *cache, const float *cos_t,
                   const float *sin_t, const float *final_norm, const float *proj_w,
                   const float *proj_b, const float *head_w, float *logits, int threads)
{
    const int64_t m = rows * t;
    if (!in)
        for (int64_t r = 0; r < m; r++)
            if (ids[r] < 0 || ids[r] >= table_rows) return -2;
    float *x = malloc((size_t)(scratch_floats(s, m) + (in ? 0 : m * s->in_width)) *
                      sizeof(float));
    if (!x) return -1;
    float *scratch = x + m * s->hidden; /* x: the residual stream [m][hidden] */
    if (!in) { /* the looked-up rows, after the residual stream and the scratch */
        float *rows_in = x + scratch_floats(s, m);
        for (int64_t r = 0; r < m; r++)
            memcpy(rows_in + r * s->in_width, table + ids[r] * s->in_width,
                   (size_t)s->in_width * sizeof(float));
        in = rows_in;
    }
    if (proj_w)
        product(in, m, s->in_width, proj_w, proj_b, s->hidden, x, 0, threads);
    else
        memcpy(x, in, (size_t)(m * s->hidden) * sizeof(float));
    for (int64_t li = 0; li < s->layers; li++)
        layer_step(&layers[li], li, s, x, rows, t, start, cache, cos_t, sin_t, scratch, threads);
    float *last = scratch; /* each row's normed last position, [rows][hidden] */
    for (int64_t r = 0; r < rows; r++)
        rms_norm(x + (r * t + t - 1) * s->hidden, final_norm, last + r * s->hidden, s->hidden,
                 (float)s->eps);
    product(last, rows, s->hidden, head_w, NULL, s->vocab, logits, 0, threads);
    free(x);
    return 0;
}

/* The first maximal entry of x[0..n-1], NaN counting as maximal (the first NaN wins), as
 * torch's and numpy's argmax. One pass for the maximum and whether a NaN is there (both
 * vectorize), then one to find where it first is. */
static int64_t first_argmax(const float *x, int64_t n)
{
    const int nan = any_nan(x, n);
    float best = x[0];
    for (int64_t i = 0; i < n; i++) best = x[i] > best ? x[i] : best;
    for (int64_t i = 0; i < n; i++)
        if (nan ? nan_bits(&x[i]) : x[i] == best) return i;
    return 0;
}

/* A frame in one call: step 0 over `in` [rows][t][in_width] read by heads[0], then for
 * j = 1..n_codes-1 one position per row, the row of tables[j-1] [table_rows][in_width] at
 * the code drawn at j-1, read by heads[j]; the same calls `dense_step_f32` makes one at a
 * time. Code j of row r: where `temperature` is NULL or temperature[r] is 0, the first
 * maximal logit (NaN counting as maximal, as torch's argmax), so a greedy row's codes
 * equal those drawn step by step; else `race_sample_row_f32` at temperature[r] with
 * top_k[r], keyed by the sampler's row_seed(seeds[r], positions[r] * n_codes + j).
 * codes: [rows][n_codes]. Returns as dense_step_f32. */
int dense_frame_f32(const struct dense_layer *layers, const struct dense_shape *s,
                    const float *in, int64_t t, int64_t rows, float *cache, const float *cos_t,
                    const float *sin_t, const float *final_norm, const float *proj_w,
                    const float *proj_b, const float *const *tables, int64_t table_rows,
                    const float *const *heads, int64_t n_codes, const float *temperature,
                    const int64_t *top_k, const uint64_t *seeds, const int64_t *positions,
                    int64_t *codes, int threads)
{
    float *logits = malloc((size_t)(rows * s->vocab) * sizeof(float));
    float *scratch = malloc((size_t)(2 * s->vocab) * sizeof(float));
    int64_t *drawn = malloc((size_t)rows * sizeof(int64_t));
    int failed = (!logits || !scratch || !drawn) ? -1 : 0;
    for (int64_t j = 0; j < n_codes && !failed; j++) {
        failed = j == 0 ? dense_step_f32(layers, s, in, NULL, NULL, 0, rows, t, 0, cache, cos_t,
                                         sin_t, final_norm, proj_w, proj_b, heads[0], logits,
                                         threads)
                        : dense_step_f32(layers, s, NULL, drawn, tables[j - 1], table_rows, rows,
                                         1, t + j - 1, cache, cos_t, sin_t, final_norm, proj_w,
                                         proj_b, heads[j], logits, threads);
        for (int64_t r = 0; r < rows && !failed; r++) {
            const float *row = logits + r * s->vocab;
            if (!temperature || temperature[r] == 0.0f)
                drawn[r] = first_argmax(row, s->vocab);
            else
                drawn[r] = race_sample_row_f32(
                    row, s->vocab, temperature[r], top_k[r],
                    race_row_key(seeds[r], (uint64_t)(positions[r] * n_codes + j)), scratch);
            codes[r * n_codes + j] = drawn[r];
        }
    }
    free(logits);
    free(scratch);
    free(drawn);
    return failed;
}

/* out[r] = tables[0][codes[r][0]] + tables[1][codes[r][1]] + ... (m tables [table_rows][width]),
 * added one table after another as torch's lookups and adds would: a code predicting
 * talker's fed-back frame. Returns -2 (nothing written) when a code is outside its table. */
int embedding_sum_f32(const float *const *tables, int64_t table_rows, int64_t width,
                      const int64_t *codes, int64_t n, int64_t m, float *out)
{
    for (int64_t i = 0; i < n * m; i++)
        if (codes[i] < 0 || codes[i] >= table_rows) return -2;
    for (int64_t r = 0; r < n; r++) {
        float *o = out + r * width;
        const int64_t *c = codes + r * m;
        memcpy(o, tables[0] + c[0] * width, (size_t)width * sizeof(float));
        for (int64_t j = 1; j < m; j++) {
            const float *row = tables[j] + c[j] * width;
            for (int64_t i = 0; i < width; i++) o[i] += row[i];
        }
    }
    return 0;
}
