/* RMS normalisation of float32 rows in one call (RMSNorm: 5 torch ops, ~30 us a
 * call at batch 1, 61 calls a SmolLM2 step).
 *
 * out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), for rows r of `dim` values.
 * Each row is summed by one thread in one order whatever the number of rows, so a
 * row's result is the same alone or in any batch. Rows are split between threads
 * only when there are enough of them to pay for waking the team. One row is
 * `rms_norm_row_f32`, which the decode program (decode_program.c) calls too.
 *
 * Qwen3-style attention normalises each q and k head of the qkv projection's rows
 * (`qk_norm_f32`, in place): every head is one `rms_norm_row_f32` over `head_dim` values,
 * so a head's arithmetic is the one function everywhere; one row is `qk_norm_row_f32`,
 * which the decode program calls too.
 *
 * The `_bf16` variants take bfloat16 rows and weights and compute as transformers' RMSNorm
 * does for them: the normalised row in float32, rounded to bfloat16, times the weight
 * (the product of two bfloat16 values is exact in float32), rounded again.
 */
#include "bf16.h"
#include "kernel_rows.h"

#include <math.h>

__attribute__((noinline)) void rms_norm_row_f32(const float *xr, const float *weight, float *o,
                                                 int64_t dim, float eps)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; i++)
        sum += xr[i] * xr[i];
    const float scale = 1.0f / sqrtf(sum / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++)
        o[i] = weight[i] * (xr[i] * scale);
}

void rms_norm_f32(const float *x, const float *weight, float *out, int64_t rows, int64_t dim,
                  float eps, int num_threads)
{
    const int threads = row_threads(rows * dim, num_threads);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row_f32(x + r * dim, weight, out + r * dim, dim, eps);
}

/* Each of the `heads` q heads (weight `q_weight`) and then the `kv_heads` k heads
 * (`k_weight`) at the start of one qkv row, `head_dim` values each, normalised in place;
 * the v heads after them are left alone. */
__attribute__((noinline)) void qk_norm_row_f32(float *row, int64_t heads, int64_t kv_heads,
                                                int64_t head_dim, const float *q_weight,
                                                const float *k_weight, float eps)
{
    for (int64_t h = 0; h < heads + kv_heads; h++) {
        float *x = row + h * head_dim;
        rms_norm_row_f32(x, h < heads ? q_weight : k_weight, x, head_dim, eps);
    }
}

/* `qk_norm_row_f32` of `rows` qkv rows `row_stride` floats apart. */
void qk_norm_f32(float *qkv, int64_t rows, int64_t row_stride, int64_t heads, int64_t kv_heads,
                 int64_t head_dim, const float *q_weight, const float *k_weight, float eps,
                 int num_threads)
{
    const int threads = row_threads(rows * row_stride, num_threads);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++)
        qk_norm_row_f32(qkv + r * row_stride, heads, kv_heads, head_dim, q_weight, k_weight, eps);
}

static void rms_norm_row_bf16(const uint16_t *xr, const uint16_t *weight, uint16_t *o,
                              int64_t dim, float eps)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; i++) {
        const float v = bf16_to_f32(xr[i]);
        sum += v * v;
    }
    const float scale = 1.0f / sqrtf(sum / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++) {
        const float normed = bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[i]) * scale));
        o[i] = f32_to_bf16(bf16_to_f32(weight[i]) * normed);
    }
}

void rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t rows,
                   int64_t dim, float eps, int num_threads)
{
    const int threads = row_threads(rows * dim, num_threads);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row_bf16(x + r * dim, weight, out + r * dim, dim, eps);
}

void qk_norm_bf16(uint16_t *qkv, int64_t rows, int64_t row_stride, int64_t heads,
                  int64_t kv_heads, int64_t head_dim, const uint16_t *q_weight,
                  const uint16_t *k_weight, float eps, int num_threads)
{
    const int threads = row_threads(rows * row_stride, num_threads);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            uint16_t *x = qkv + r * row_stride + h * head_dim;
            rms_norm_row_bf16(x, h < heads ? q_weight : k_weight, x, head_dim, eps);
        }
}
