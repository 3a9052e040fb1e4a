/* RMS normalisation of float32 rows in one call (RMSNorm: 5 torch ops, ~30 us a
 * call at batch 1, 61 calls a SmolLM2 step).
 *
 * out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), for rows r of `dim` values.
 * Each row is summed by one thread in one order whatever the number of rows, so a
 * row's result is the same alone or in any batch. Rows are split between threads
 * only when there are enough of them to pay for waking the team. One row is
 * `rms_norm_row_f32`, which the decode program (decode_program.c) calls too.
 */
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
    const int threads = rows >= 64 ? num_threads : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row_f32(x + r * dim, weight, out + r * dim, dim, eps);
}
