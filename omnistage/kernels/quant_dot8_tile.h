/* The body of the vector int8 dot kernels, included by quant_dot8.c once per
 * instruction set, after defining:
 *   DOT8_TARGET  the target attribute;       DOT8_MR      the most rows of x per tile;
 *   DOT8_TILE    the tile function's name;    DOT8_UNIT    the unit function's name;
 *   DOT8_LANES   (v, q, negoff, type) -> the 8 exact integer lanes of a sub-block;
 *   DOT8_NEGOFF  (q, type) -> -(o * lane sums of q), shared by the rows of W.
 * (No include guard: it is meant to be included twice; it undefines them at the end.)
 */

/* y[m, 0:rows] = x[m0 + m] . W[r] for MR rows of x and up to 4 rows of W, whole K. */
DOT8_TARGET INLINE void DOT8_TILE(struct act8 a, int64_t m0, int64_t K, const uint8_t *w,
                                  int64_t row_bytes, int64_t rows, float *y, int64_t ldy,
                                  const int type, const int MR)
{
    const uint8_t *rp[4];
    for (int r = 0; r < 4; r++) rp[r] = w + (rows > r ? r * row_bytes : 0);
    const int64_t nb = K / 32, step = block_bytes(type) * 32 / block_elems(type);
    __m256 acc[DOT8_MR][4];
    __m128 accm[DOT8_MR]; /* the min terms, lane r for W row r */
    for (int m = 0; m < MR; m++) {
        for (int r = 0; r < 4; r++) acc[m][r] = _mm256_setzero_ps();
        accm[m] = _mm_setzero_ps();
    }
    for (int64_t j = 0; j < nb; j++) {
        __m256i q[DOT8_MR], neg[DOT8_MR];
        __m256 dx[DOT8_MR];
        __m128 sx[DOT8_MR];
        for (int m = 0; m < MR; m++) {
            q[m] = _mm256_loadu_si256((const __m256i *)(a.q + (m0 + m) * K + 32 * j));
            neg[m] = DOT8_NEGOFF(q[m], type);
            dx[m] = _mm256_set1_ps(a.d[(m0 + m) * nb + j]);
            sx[m] = _mm_set1_ps(a.s[(m0 + m) * nb + j]);
        }
        for (int r = 0; r < 4; r++)
            _mm_prefetch((const char *)rp[r] + PREFETCH_ROWS * row_bytes + j * step, _MM_HINT_T1);
        if (SIMPLE8(type)) { /* the 4 rows' scales (and mins) converted in one instruction */
            const __m256 heads = heads4_simple(rp, j, type);
            __m256 hd[DOT8_MR]; /* lane 2r: fl(d_r * d_x) */
            for (int m = 0; m < MR; m++) hd[m] = _mm256_mul_ps(heads, dx[m]);
            if (type == T_Q4_1) {
                const __m128 m4 = _mm256_castps256_ps128(
                    _mm256_permutevar8x32_ps(heads, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)));
                for (int m = 0; m < MR; m++) accm[m] = _mm_fmadd_ps(m4, sx[m], accm[m]);
            }
            for (int r = 0; r < 4; r++) {
                const __m256i v = bytes8_simple(rp[r], j, type);
                for (int m = 0; m < MR; m++) {
                    const __m256 g = _mm256_cvtepi32_ps(DOT8_LANES(v, q[m], neg[m], type));
                    const __m256 sc = _mm256_permutevar8x32_ps(hd[m], _mm256_set1_epi32(2 * r));
                    acc[m][r] = _mm256_fmadd_ps(g, sc, acc[m][r]);
                }
            }
            continue;
        }
        float mn[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int r = 0; r < 4; r++) {
            __m256 scale;
            const __m256i v = unpack8_256(rp[r], j, &scale, &mn[r], type);
            for (int m = 0; m < MR; m++) {
                const __m256 g = _mm256_cvtepi32_ps(DOT8_LANES(v, q[m], neg[m], type));
                acc[m][r] = _mm256_fmadd_ps(g, _mm256_mul_ps(scale, dx[m]), acc[m][r]);
            }
        }
        if (type == T_Q4_K)
            for (int m = 0; m < MR; m++) accm[m] = _mm_fmadd_ps(_mm_loadu_ps(mn), sx[m], accm[m]);
    }
    for (int m = 0; m < MR; m++)
        store_rows(y + m * ldy, _mm_add_ps(tree8x4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]), accm[m]),
                   rows);
}

/* y[0:M, 0:nt] for a unit of nt rows of W: tiles of DOT8_MR rows of x by 4 of W (the
 * unit's rows stay in L1 while the groups of x rows pass over them). */
DOT8_TARGET INLINE void DOT8_UNIT(struct act8 a, int64_t M, int64_t K, const uint8_t *w,
                                  int64_t row_bytes, int64_t nt, float *y, int64_t ldy,
                                  const int type)
{
    for (int64_t m0 = 0; m0 < M; m0 += DOT8_MR) {
        const int64_t mr = M - m0 < DOT8_MR ? M - m0 : DOT8_MR;
        for (int64_t r0 = 0; r0 < nt; r0 += 4) {
            const int64_t rows = nt - r0 < 4 ? nt - r0 : 4;
            const uint8_t *wr = w + r0 * row_bytes;
            float *yr = y + m0 * ldy + r0;
            switch (mr) {
            case 1: DOT8_TILE(a, m0, K, wr, row_bytes, rows, yr, ldy, type, 1); break;
#if DOT8_MR > 2
            case 2: DOT8_TILE(a, m0, K, wr, row_bytes, rows, yr, ldy, type, 2); break;
            case 3: DOT8_TILE(a, m0, K, wr, row_bytes, rows, yr, ldy, type, 3); break;
            default: DOT8_TILE(a, m0, K, wr, row_bytes, rows, yr, ldy, type, 4); break;
#else
            default: DOT8_TILE(a, m0, K, wr, row_bytes, rows, yr, ldy, type, 2); break;
#endif
            }
        }
    }
}

#undef DOT8_TARGET
#undef DOT8_MR
#undef DOT8_TILE
#undef DOT8_UNIT
#undef DOT8_LANES
#undef DOT8_NEGOFF
