/* The exponential race's draws (`sample/sampler.py`): q[r][j] = -log(u), u uniform in
 * (0, 1), a pure function of the row's key and the token index j (a counter-based draw:
 * splitmix64 of key + (j + 1) * golden ratio, its top 23 bits as (2m + 1) / 2^24, exactly a
 * float32), so a row's draws never depend on other rows, and any token's draw can be
 * computed alone. The log is Cephes' logf polynomial written with explicit fmaf (about
 * 1 ulp; the same floats on every build, and the loop vectorizes, where libm's logf
 * would not): ~1-2 ns a draw, against ~5 ns for torch's Mersenne-twister `uniform_` that
 * the sampler used per row and position before.
 *
 * `sampler.py` has the same draw in torch ops (other devices, or no C kernels here); its
 * `torch.log` may differ from this one in the last bit.
 *
 * Also the sampler's two filters on float32 rows, each giving exactly what its torch path
 * gives: top-k (`top_k_mask_f32`) and top-p's cutoff (`top_p_cutoff_f32`), both from a
 * min-heap of a row's largest values instead of torch's partial sort; and the race's pick
 * itself (`race_pick_f32`), drawing only the tokens a row can pick. */
#include "exp_vec.h"
#include "kernel_rows.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ull

static inline float race_uniform(uint64_t key, int64_t j)
{
    uint64_t z = key + (uint64_t)(j + 1) * GOLDEN;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(2 * (z >> 41) + 1) * 0x1p-24f;
}

/* log(x) for a normal x > 0 (Cephes logf). */
static inline float log_vec(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    float e = (float)((int32_t)((bits >> 23) & 0xff) - 126);
    bits = (bits & 0x007fffffu) | 0x3f000000u; /* the mantissa in [0.5, 1) */
    float m;
    memcpy(&m, &bits, sizeof m);
    const int low = m < 0.70710678118654752440f;
    e = low ? e - 1.0f : e;
    m = low ? m + m - 1.0f : m - 1.0f;
    const float z = m * m;
    float y = 7.0376836292e-2f;
    y = fmaf(y, m, -1.1514610310e-1f);
    y = fmaf(y, m, 1.1676998740e-1f);
    y = fmaf(y, m, -1.2420140846e-1f);
    y = fmaf(y, m, 1.4249322787e-1f);
    y = fmaf(y, m, -1.6668057665e-1f);
    y = fmaf(y, m, 2.0000714765e-1f);
    y = fmaf(y, m, -2.4999993993e-1f);
    y = fmaf(y, m, 3.3333331174e-1f);
    y = y * m * z;
    y = fmaf(e, -2.12194440e-4f, y);
    y = fmaf(-0.5f, z, y);
    return fmaf(e, 0.693359375f, m + y);
}

/* q[r][j] = -log(u(keys[r], j)) for rows r < rows, j < vocab (float32). */
void race_exponentials_f32(const uint64_t *keys, int64_t rows, int64_t vocab, float *q,
                           int num_threads)
{
#pragma omp parallel for schedule(static) num_threads(row_threads(rows * vocab, num_threads))
    for (int64_t r = 0; r < rows; r++) {
        const uint64_t key = keys[r];
        float *out = q + r * vocab;
        for (int64_t j = 0; j < vocab; j++) out[j] = -log_vec(race_uniform(key, j));
    }
}

/* Sift `v` down from the root of a min-heap of `n` values. */
static inline void heap_replace_min(float *heap, int64_t n, float v)
{
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= v) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = v;
}

/* Add `v` to a min-heap of `n` values (sift up); it then holds n + 1. */
static inline void heap_push(float *heap, int64_t n, float v)
{
    int64_t i = n;
    while (i > 0 && heap[(i - 1) / 2] > v) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = v;
}

/* The `m` largest values of x[0..n) in `heap` (a min-heap; m <= n), in any order. */
static void heap_of_largest(const float *x, int64_t n, int64_t m, float *heap)
{
    for (int64_t j = 0; j < m; j++) heap_push(heap, j, x[j]);
    for (int64_t j = m; j < n; j++)
        if (x[j] > heap[0]) heap_replace_min(heap, m, x[j]);
}

#define SELECT_BLOCK 16
#define SELECT_MAX_BLOCKS 4096

/* The `m` largest values of x[0..vocab) in `heap` (a min-heap; m <= vocab). Where there
 * are at least m blocks of 16 values, the m-th largest block maximum is a floor: at least
 * m values (those maxima) reach it, so no value below it is among the m largest, and only
 * the values at or above it (a few more than m, on most rows) go through the heap; the
 * heap ends with the same values either way. */
static void largest_values(const float *x, int64_t vocab, int64_t m, float *heap)
{
    const int64_t blocks = vocab / SELECT_BLOCK;
    if (blocks < m || blocks > SELECT_MAX_BLOCKS) {
        heap_of_largest(x, vocab, m, heap);
        return;
    }
    float maxima[SELECT_MAX_BLOCKS];
    for (int64_t b = 0; b < blocks; b++) {
        float top = x[b * SELECT_BLOCK];
        for (int64_t i = 1; i < SELECT_BLOCK; i++) {
            const float v = x[b * SELECT_BLOCK + i];
            top = v > top ? v : top;
        }
        maxima[b] = top;
    }
    heap_of_largest(maxima, blocks, m, heap);
    const float floor = heap[0];
    int64_t filled = 0;
    for (int64_t j = 0; j < vocab; j++) {
        const float v = x[j];
        if (!(v >= floor)) continue;
        if (filled < m)
            heap_push(heap, filled++, v);
        else if (v > heap[0])
            heap_replace_min(heap, m, v);
    }
}

/* Top-k filtering of one float32 row in place (see `top_k_mask_f32`); 1 if it holds a NaN
 * (left alone then), else 0. `heap` holds k floats. */
static int top_k_mask_row(float *x, int64_t vocab, int64_t k, float *heap)
{
    if (any_nan(x, vocab)) return 1;
    if (k <= 0 || k >= vocab) return 0;
    largest_values(x, vocab, k, heap);
    const float kth = heap[0];
    const uint32_t minus_inf = 0xff800000u; /* as bits: the build assumes finite math */
    for (int64_t j = 0; j < vocab; j++)
        if (x[j] < kth) memcpy(x + j, &minus_inf, sizeof minus_inf);
    return 0;
}

/* Top-k filtering of float32 rows in place: values below the row's k-th largest (ties all
 * kept) become -inf, for rows whose k[r] is in (0, vocab); other rows are left alone. The
 * k-th largest is exact: a min-heap of the k largest values seen (one compare per value
 * once it is full; torch's `topk` partial sort costs ~2-4x more on fresh data). Rows are
 * independent (split between threads when large); `scratch` holds `heap_size` floats per
 * row. Returns 1 when a row holds a NaN (that row left alone: torch's order for NaN is for
 * the caller to apply, and filtering the others again changes nothing), else 0. */
int top_k_mask_f32(float *logits, int64_t rows, int64_t vocab, const int64_t *k, float *scratch,
                   int64_t heap_size, int num_threads)
{
    int nan_rows = 0;
#pragma omp parallel for schedule(static) num_threads(row_threads(rows * vocab, num_threads)) \
    reduction(| : nan_rows)
    for (int64_t r = 0; r < rows; r++)
        nan_rows |= top_k_mask_row(logits + r * vocab, vocab, k[r], scratch + r * heap_size);
    return nan_rows;
}

/* Top-p's cutoff from each row's `prefix` largest probabilities, as `sampler.py`'s
 * `_top_p_cutoff` computes it from torch's `topk` and `cumsum`: the values sorted
 * descending, their running sums accumulated in double and rounded to float at each
 * step (torch's CPU cumsum of float32), kept while the sum before is < p; cutoff[r] the
 * last kept value, resolved[r] 1 where the prefix's whole sum reaches p. A row holding a
 * NaN is left unresolved (the caller's full sort decides it, as torch's would). */
void top_p_cutoff_f32(const float *probs, int64_t rows, int64_t vocab, const float *p,
                      int64_t prefix, float *cutoff, uint8_t *resolved, float *scratch,
                      int num_threads)
{
    const int64_t m = prefix < vocab ? prefix : vocab;
#pragma omp parallel for schedule(static) num_threads(row_threads(rows * vocab, num_threads))
    for (int64_t r = 0; r < rows; r++) {
        const float *x = probs + r * vocab;
        float *heap = scratch + r * m;
        resolved[r] = 0;
        cutoff[r] = 0.0f;
        if (any_nan(x, vocab)) continue;
        largest_values(x, vocab, m, heap);
        for (int64_t n = m; n > 1; n--) { /* heap sort: the smallest to the end */
            const float smallest = heap[0];
            heap_replace_min(heap, n - 1, heap[n - 1]);
            heap[n - 1] = smallest;
        }
        double sum = 0.0;
        int64_t keep = 1;
        for (int64_t i = 0; i < m; i++) {
            sum += (double)heap[i];
            if (i < m - 1 && (float)sum < p[r]) keep++;
        }
        resolved[r] = (float)sum >= p[r];
        cutoff[r] = heap[keep - 1];
    }
}

#define RACE_BLOCK 64

/* The race's pick of each row: the first j with the largest probs[r][j] / q(keys[r], j), q
 * drawn as `race_exponentials_f32` draws it, NaN counting as largest: numpy's argmax of
 * `probs / q`, without the [rows][vocab] draws. Only tokens of nonzero probability are
 * drawn: their quotients are >= 0, so a 0 / q = 0 is never above the row's best so far and
 * skipping it changes no pick, and a row filtered by top-k or top-p draws its few kept
 * tokens instead of the whole vocabulary. */
void race_pick_f32(const float *probs, int64_t rows, int64_t vocab, const uint64_t *keys,
                   int64_t *picks, int num_threads)
{
#pragma omp parallel for schedule(static) num_threads(row_threads(rows * vocab, num_threads))
    for (int64_t r = 0; r < rows; r++) {
        const float *p = probs + r * vocab;
        int64_t best = 0;
        float top = 0.0f;
        for (int64_t j = 0; j < vocab; j += RACE_BLOCK) {
            const int64_t n = vocab - j < RACE_BLOCK ? vocab - j : RACE_BLOCK;
            uint32_t nonzero = 0, bits[RACE_BLOCK];
            memcpy(bits, p + j, (size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++) nonzero |= bits[i] & 0x7fffffffu;
            if (!nonzero) continue;
            if (any_nan(p + j, n)) { /* the first NaN is the pick */
                int64_t i = 0;
                while (!nan_bits(p + j + i)) i++;
                best = j + i;
                break;
            }
            float v[RACE_BLOCK];
            for (int64_t i = 0; i < n; i++) /* 0 / q = 0: never above `top` */
                v[i] = p[j + i] / -log_vec(race_uniform(keys[r], j + i));
            float most = 0.0f;
            for (int64_t i = 0; i < n; i++) most = v[i] > most ? v[i] : most;
            if (most > top) {
                int64_t i = 0;
                while (v[i] != most) i++;
                top = most, best = j + i;
            }
        }
        picks[r] = best;
    }
}

/* `row_seed` of sampler.py: splitmix64 of seed * 1000003 + position, the top bit cleared
 * (the key of a row's draws at one output position). */
uint64_t race_row_key(uint64_t seed, uint64_t position)
{
    uint64_t x = seed * 1000003ull + position + GOLDEN;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (x ^ (x >> 31)) & 0x7fffffffffffffffull;
}

/* One row's draw at temperature t > 0 with top-k k (none where k <= 0 or k >= vocab), the
 * race keyed by `key`: over the kept tokens (s_j = x_j / t at least the k-th largest s),
 * the first j with the largest exp(s_j - max s) / q(key, j) — the sampler's pick without
 * its normalization (a common factor of the quotients; the same distribution, not always
 * the same float comparisons as `Sampler`'s softmax). The first NaN where x holds one.
 * The exp is exp_vec's, so a top-k row (its few kept tokens, one by one) and a row
 * without (every token, in a loop that vectorizes) compute the same quotients. `scratch`
 * holds vocab + k floats. */
int64_t race_sample_row_f32(const float *x, int64_t vocab, float t, int64_t k, uint64_t key,
                            float *scratch)
{
    float *s = scratch, *heap = scratch + vocab;
    if (any_nan(x, vocab))
        for (int64_t j = 0;; j++)
            if (nan_bits(x + j)) return j;
    for (int64_t j = 0; j < vocab; j++) s[j] = x[j] / t;
    float top = s[0];
    for (int64_t j = 0; j < vocab; j++) top = s[j] > top ? s[j] : top;
    int64_t best = 0;
    float best_v = -1.0f; /* every kept token's quotient is > 0 */
    if (k > 0 && k < vocab) {
        largest_values(s, vocab, k, heap);
        const float least = heap[0];
        for (int64_t j = 0; j < vocab; j++) {
            if (s[j] < least) continue;
            const float v = exp_vec(s[j] - top) / -log_vec(race_uniform(key, j));
            if (v > best_v) best_v = v, best = j;
        }
        return best;
    }
    for (int64_t j = 0; j < vocab; j++) { /* -inf (a masked token): 0, never picked */
        const float v = exp_vec(s[j] - top) / -log_vec(race_uniform(key, j));
        s[j] = s[j] >= -FLT_MAX ? v : 0.0f;
    }
    for (int64_t j = 0; j < vocab; j++) best_v = s[j] > best_v ? s[j] : best_v;
    for (int64_t j = 0; j < vocab; j++)
        if (s[j] == best_v) return j;
    return 0;
}
