/* q4_int8_gemm.c's batched paths on AVX2 (included by q4_int8_gemm.c after gemm_job and its
 * helpers; LADLE_AVX2 builds only): the AVX-512 VNNI interleaved paths' scheme at half the
 * width, for 4-bit and for 8-bit weight codes. The codes of 8 weight rows are interleaved so that int32 lane l of a vector holds 4
 * codes of row l; per group, 8 products against 4 broadcast activation codes each leave the
 * group's integer dot product of all 8 rows in one vector, and the group's scaling (convert,
 * scale, multiply-add, the offset's multiply-add) is paid once per 8 rows instead of once per
 * 32 products as micro_kernel pays it.
 *
 * Without VNNI the products are vpmaddubsw's int16 pair sums (15 * 128 * 2 = 3840 at most),
 * which the 8 steps of a group add up in int16 (8 * 3840 < 32768) before one vpmaddwd widens
 * them; with the 256-bit vpdpbusd (AVX-VNNI) they accumulate in int32 directly.
 */
#ifndef LADLE_INTERLEAVED_AVX2_H
#define LADLE_INTERLEAVED_AVX2_H

#define LANES8 8
#define AVX2_INTERLEAVED_MIN_ROWS 5 /* level with micro_kernel at 4 rows, 0.64x its time at 32 */
#define AVX2_INTERLEAVED_MAX_GROUPS 128 /* K up to 4096: the block's buffers stay on the stack */

/* out[j], int32 lane l: 32-bit word j of z[l] (j, l < 8): an 8 x 8 transpose of words. Within
 * each 128-bit half, unpacks pair rows, then quadruples of rows; the last step joins rows 0-3
 * and 4-7 of one word from the two halves. */
static inline void transpose_words8x8(const __m256i z[8], __m256i out[8]) {
    __m256i t[8], u[8];
    for (int k = 0; k < 8; k += 2) { /* words 0, 1 (and 4, 5) / 2, 3 (6, 7) of rows k, k + 1 */
        t[k] = _mm256_unpacklo_epi32(z[k], z[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(z[k], z[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) { /* u[k + e]: word e (and 4 + e) of rows k .. k + 3 */
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int e = 0; e < 4; e++) {
        out[e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x20);
        out[4 + e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x31);
    }
}

/* out[j], int32 lane l: bytes at + 4 j .. + 3 of rows[l] */
static inline void transpose8x8(const uint8_t *rows[LANES8], int64_t at, __m256i out[8]) {
    __m256i z[8];
    for (int k = 0; k < 8; k++) z[k] = _mm256_loadu_si256((const __m256i *)(rows[k] + at));
    transpose_words8x8(z, out);
}

/* codes[p * 8 + j], lane l: bytes 32 p + 4 j .. + 3 of weight row `row` + l (rows past n
 * repeat the last); the low nibbles are 4 codes of group p, the high ones of group p + h. */
static void avx2_interleave_codes(const gemm_job *job, int64_t row, __m256i *codes) {
    const int64_t row_bytes = job->padded / 2;
    const uint8_t *rows[LANES8];
    for (int l = 0; l < LANES8; l++)
        rows[l] = job->codes + (row + l < job->n ? row + l : job->n - 1) * row_bytes;
    for (int64_t p = 0; p < job->padded / 64; p++) transpose8x8(rows, 32 * p, codes + p * 8);
}

/* scales[g * 8 + l] (and offsets) of weight row `row` + l, float32 */
static void avx2_interleave_params(const gemm_job *job, int64_t row, float *scales,
                                   float *offsets) {
    const int64_t num_groups = job->padded / GROUP;
    for (int l = 0; l < LANES8; l++) {
        const int64_t n = row + l < job->n ? row + l : job->n - 1;
        for (int64_t g = 0; g < num_groups; g++) {
            scales[g * LANES8 + l] = param(job, job->scale, n * num_groups + g);
            if (job->offset) offsets[g * LANES8 + l] = param(job, job->offset, n * num_groups + g);
        }
    }
}

/* The 4 activation codes at byte `at`, broadcast to every lane. */
static inline __m256i broadcast4_256(const int8_t *values, int64_t at) {
    int32_t word;
    memcpy(&word, values + at, 4);
    return _mm256_set1_epi32(word);
}

/* One group's dot products of the 8 rows' codes w[] with 32 activation codes q. */
static inline __attribute__((always_inline)) __m256i group_dot8(const __m256i w[8],
                                                               const int8_t *q) {
#if defined(LADLE_VNNI256)
    __m256i dot = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) dot = ladle_dpbusd256(dot, w[j], broadcast4_256(q, 4 * j));
    return dot;
#else
    __m256i pairs = _mm256_maddubs_epi16(w[0], broadcast4_256(q, 0));
    for (int j = 1; j < 8; j++)
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[j], broadcast4_256(q, 4 * j)));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

/* out[i] lane l = x row x_row + i times weight row `row` + l (offset term included) */
static inline __attribute__((always_inline)) void avx2_interleaved_tile(
    const gemm_job *job, int64_t x_row, int num_x, int two_pass, const __m256i *codes,
    const float *scales, const float *offsets, __m256 out[X_TILE]) {
    const int64_t num_groups = job->padded / GROUP, h = num_groups / 2;
    const __m256i low_mask = _mm256_set1_epi8(0x0F);
    __m256 acc[X_TILE];
    for (int i = 0; i < num_x; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < num_groups; g++) {
        const int64_t step = g < h ? g : g - h;
        __m256i w[8];
        for (int j = 0; j < 8; j++)
            w[j] = g < h ? _mm256_and_si256(codes[step * 8 + j], low_mask)
                         : _mm256_and_si256(_mm256_srli_epi16(codes[step * 8 + j], 4), low_mask);
        const __m256 s = _mm256_loadu_ps(scales + g * LANES8);
        for (int i = 0; i < num_x; i++) {
            const int64_t xi = x_row + i;
            __m256i dot = group_dot8(w, job->q + xi * job->padded + g * GROUP);
            if (two_pass)
                dot = _mm256_add_epi32(
                    _mm256_slli_epi32(dot, 8),
                    group_dot8(w, job->residual + xi * job->padded + g * GROUP));
            const __m256 xd = _mm256_set1_ps(job->d[xi * num_groups + g]);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s, xd), acc[i]);
            if (job->offset)
                acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(offsets + g * LANES8),
                                         _mm256_set1_ps(job->sums[xi * num_groups + g]), acc[i]);
        }
    }
    for (int i = 0; i < num_x; i++) out[i] = acc[i];
}

static void avx2_interleaved_chunk(const void *args, int64_t chunk) {
    const gemm_job *job = args;
    int64_t first, last;
    ladle_chunk_blocks(chunk, (job->n + LANES8 - 1) / LANES8, 1, &first, &last);
    __m256i codes[AVX2_INTERLEAVED_MAX_GROUPS / 2 * 8]; /* 16 KiB */
    float scales[AVX2_INTERLEAVED_MAX_GROUPS * LANES8];
    float offsets[AVX2_INTERLEAVED_MAX_GROUPS * LANES8];
    for (int64_t block = first; block < last; block++) {
        const int64_t row = block * LANES8;
        const int rows_here = job->n - row < LANES8 ? (int)(job->n - row) : LANES8;
        avx2_interleave_codes(job, row, codes);
        avx2_interleave_params(job, row, scales, offsets);
        for (int64_t x_row = 0; x_row < job->m; x_row += X_TILE) {
            const int num_x = job->m - x_row < X_TILE ? (int)(job->m - x_row) : X_TILE;
            __m256 out[X_TILE];
            switch (num_x + (job->residual ? X_TILE : 0)) {
            case 1: avx2_interleaved_tile(job, x_row, 1, 0, codes, scales, offsets, out); break;
            case 2: avx2_interleaved_tile(job, x_row, 2, 0, codes, scales, offsets, out); break;
            case 3: avx2_interleaved_tile(job, x_row, 3, 0, codes, scales, offsets, out); break;
            case 4: avx2_interleaved_tile(job, x_row, 4, 0, codes, scales, offsets, out); break;
            case 5: avx2_interleaved_tile(job, x_row, 1, 1, codes, scales, offsets, out); break;
            case 6: avx2_interleaved_tile(job, x_row, 2, 1, codes, scales, offsets, out); break;
            case 7: avx2_interleaved_tile(job, x_row, 3, 1, codes, scales, offsets, out); break;
            default: avx2_interleaved_tile(job, x_row, 4, 1, codes, scales, offsets, out); break;
            }
            for (int i = 0; i < num_x; i++) {
                float values[LANES8];
                _mm256_storeu_ps(values, out[i]);
                float *y = job->y + (x_row + i) * job->n + row;
                for (int l = 0; l < rows_here; l++)
                    y[l] = values[l] + (job->bias ? job->bias[row + l] : 0.0f);
            }
        }
    }
}

/* 8-bit weight codes (GGUF Q8_0, the default model's tied LM head). vpmaddubsw needs one
 * unsigned side, and neither the signed codes nor the activations are; the sign trick (|w| times
 * x with w's sign) would overflow its int16 pair sums across a group. So both sides widen to
 * int16: the codes once per block of 8 rows, the activations once per row as one int16 each,
 * 256 q + r (16-bit activations: in [-32640, 32639]) or q, and vpmaddwd (vpdpwssd with
 * AVX-VNNI) multiplies pairs into int32 exactly: per group and row of x, 16 instructions of 16
 * products each, both passes at once. */
#define AVX2_INTERLEAVED8_MIN_ROWS 2

#if defined(LADLE_VNNI256)
#if defined(__AVXVNNI__)
#define ladle_dpwssd256(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#else
#define ladle_dpwssd256(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#endif
#else
#define ladle_dpwssd256(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif

/* codes[g * 16 + j], int32 lane l: int16 codes 2 j and 2 j + 1 of group g of row `row` + l */
static void avx2_interleave_codes8(const gemm_job *job, int64_t row, __m256i *codes) {
    const int64_t num_groups = job->padded / GROUP;
    const int8_t *rows[LANES8];
    for (int l = 0; l < LANES8; l++)
        rows[l] = (const int8_t *)job->codes + (row + l < job->n ? row + l : job->n - 1) * job->padded;
    for (int64_t g = 0; g < num_groups; g++)
        for (int half = 0; half < 2; half++) {
            __m256i z[8];
            for (int l = 0; l < LANES8; l++)
                z[l] = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128((const __m128i *)(rows[l] + g * GROUP + 16 * half)));
            transpose_words8x8(z, codes + g * 16 + 8 * half);
        }
}

static inline __attribute__((always_inline)) void avx2_interleaved8_tile(
    const gemm_job *job, int64_t x_row, int num_x, const __m256i *codes, const float *scales,
    __m256 out[X_TILE]) {
    const int64_t num_groups = job->padded / GROUP;
    __m256 acc[X_TILE];
    for (int i = 0; i < num_x; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < num_groups; g++) {
        const __m256 s = _mm256_loadu_ps(scales + g * LANES8);
        for (int i = 0; i < num_x; i++) {
            const int64_t xi = x_row + i;
            const int16_t *x16 = job->x16 + xi * job->padded + g * GROUP;
            __m256i dot = _mm256_setzero_si256();
            for (int j = 0; j < 16; j++) {
                int32_t pair;
                memcpy(&pair, x16 + 2 * j, 4);
                dot = ladle_dpwssd256(dot, codes[g * 16 + j], _mm256_set1_epi32(pair));
            }
            const __m256 xd = _mm256_set1_ps(job->d[xi * num_groups + g]);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s, xd), acc[i]);
        }
    }
    for (int i = 0; i < num_x; i++) out[i] = acc[i];
}

static void avx2_interleaved8_chunk(const void *args, int64_t chunk) {
    const gemm_job *job = args;
    int64_t first, last;
    ladle_chunk_blocks(chunk, (job->n + LANES8 - 1) / LANES8, 1, &first, &last);
    __m256i codes[AVX2_INTERLEAVED_MAX_GROUPS * 16]; /* 64 KiB */
    float scales[AVX2_INTERLEAVED_MAX_GROUPS * LANES8], unused[AVX2_INTERLEAVED_MAX_GROUPS * LANES8];
    for (int64_t block = first; block < last; block++) {
        const int64_t row = block * LANES8;
        const int rows_here = job->n - row < LANES8 ? (int)(job->n - row) : LANES8;
        avx2_interleave_codes8(job, row, codes);
        avx2_interleave_params(job, row, scales, unused);
        for (int64_t x_row = 0; x_row < job->m; x_row += X_TILE) {
            const int num_x = job->m - x_row < X_TILE ? (int)(job->m - x_row) : X_TILE;
            __m256 out[X_TILE];
            switch (num_x) {
            case 1: avx2_interleaved8_tile(job, x_row, 1, codes, scales, out); break;
            case 2: avx2_interleaved8_tile(job, x_row, 2, codes, scales, out); break;
            case 3: avx2_interleaved8_tile(job, x_row, 3, codes, scales, out); break;
            default: avx2_interleaved8_tile(job, x_row, 4, codes, scales, out); break;
            }
            for (int i = 0; i < num_x; i++) {
                float values[LANES8];
                _mm256_storeu_ps(values, out[i]);
                float *y = job->y + (x_row + i) * job->n + row;
                for (int l = 0; l < rows_here; l++)
                    y[l] = values[l] + (job->bias ? job->bias[row + l] : 0.0f);
            }
        }
    }
}

#endif
