/* 4-bit weights in groups of 32 (GGUF's Q4_0 / Q4_1 / Q4_K, as group_quant.py keeps them)
 * multiplied by activations quantized on the fly, with integer dot products:
 *
 *     w[n][k] = code[n][k] * s[n][g] + o[n][g],            g = k / 32, code in 0..15
 *     x[i][k] ~ q[i][k] * d[i][g],                         q in -127..127, d = max|x| / 127
 *     y[i][n] = sum_g s[n][g] d[i][g] (sum_k code q) + o[n][g] (sum_k x[i][k])   (+ bias[n])
 *
 * The offset term uses the float sum of the group's activations, so Q4_1's minimum (and
 * Q4_0's -8 d) folds in exactly; only the code term sees the activations' rounding. With 8-bit
 * activations that is the numerics of llama.cpp's Q4_1 x Q8_1 dot product (which keeps the
 * quantized sum instead); it moved the default model's perplexity by +1.1%, so the default is
 * 16 bits: a second int8 code per activation holds the first one's remainder times 256,
 * x ~ d (q + r / 256), and the integer sum is 256 sum(code q) + sum(code r) (two passes).
 *
 * Why: a GEMV that widens the codes to float32 spends ~4 vector instructions per 16 weights;
 * here one VNNI `vpdpbusd` multiplies 64 code/activation byte pairs, so batches of rows cost a
 * fraction of the float arithmetic, and one row still streams each weight's 4 bits once. From
 * INTERLEAVED_MIN_ROWS rows of x, blocks of 16 weight rows are interleaved first (see
 * interleave_codes), so a group's scaling is paid once per 16 weight rows.
 *
 * Layout: byte j of a weight row holds column j (low nibble) and column j + padded / 2 (high),
 * so with padded % 64 == 0 the 32 bytes at 32 p hold group p (low nibbles) and group
 * p + groups / 2 (high): masking and shifting one load gives codes in the activations' own
 * column order (64 bytes: two groups of each half per AVX-512 step).
 *
 * Paths, chosen at build time (-march=native; simd_level.h): AVX-512 VNNI (512-bit vpdpbusd),
 * AVX2 (vpmaddubsw + vpmaddwd; AVX-VNNI's 256-bit vpdpbusd where the CPU has it; the batched
 * interleaved paths in interleaved_avx2.h), plain C.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half_float.h"
#include "thread_pool.h"
#include "vector_sum.h"

#include "simd_level.h"

#define GROUP 32
#define ROW_BLOCK 4   /* weight rows per micro-kernel call (clamped at the last block) */
#define X_TILE 4      /* activation rows per micro-kernel call */
#define MAX_GROUPS 1024
/* float32 group parameters are read 16 at a time from any group: rows of them are padded */
#define PARAM_PAD 16
#define PARAM_STRIDE (MAX_GROUPS + PARAM_PAD)
#define BLOCKS_PER_CHUNK 4
#define MIN_PARALLEL_WORK (1 << 17) /* weights x rows below which one thread is faster */


#if defined(LADLE_AVX512)
/* 16 codes: round to nearest even (the default MXCSR mode), then narrow with saturation; the
 * remainders of the scaled values go to *residual. */
static inline __m128i round16(__m512 scaled, __m512 *residual) {
    __m512i rounded = _mm512_cvtps_epi32(scaled);
    *residual = _mm512_sub_ps(scaled, _mm512_cvtepi32_ps(rounded));
    return _mm512_cvtsepi32_epi8(rounded);
}
#endif

#if defined(LADLE_AVX2)
/* 32 int32 codes (four vectors of 8) narrowed with saturation to 32 int8 in their order: the
 * packs work within 128-bit lanes, so the last permute puts the 4-byte words back in order. */
static inline __m256i narrow32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i words = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

static inline int8_t saturate8(float value) {
    long rounded = lrintf(value);
    return (int8_t)(rounded > 127 ? 127 : rounded < -128 ? -128 : rounded);
}

/* One activation row: its int8 codes, the group scales d and the groups' float sums; with
 * `residual` (16-bit activations) also the codes of what the first ones leave, times 256, and
 * d is then the scale of 256 * code + residual code. */
static void quantize_row(const float *x, int64_t num_groups, int8_t *q, int8_t *residual,
                         float *d, float *sums) {
    for (int64_t g = 0; g < num_groups; g++) {
        const float *values = x + g * GROUP;
        int8_t *codes = q + g * GROUP;
#if defined(LADLE_AVX512)
        const __m512 a = _mm512_loadu_ps(values), b = _mm512_loadu_ps(values + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        const float sum = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
        const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512 rest_a, rest_b, unused;
        _mm_storeu_si128((__m128i *)codes, round16(_mm512_mul_ps(a, inverse), &rest_a));
        _mm_storeu_si128((__m128i *)(codes + 16), round16(_mm512_mul_ps(b, inverse), &rest_b));
        if (residual) {
            const __m512 times = _mm512_set1_ps(256.0f);
            _mm_storeu_si128((__m128i *)(residual + g * GROUP),
                             round16(_mm512_mul_ps(rest_a, times), &unused));
            _mm_storeu_si128((__m128i *)(residual + g * GROUP + 16),
                             round16(_mm512_mul_ps(rest_b, times), &unused));
        }
#elif defined(LADLE_AVX2)
        /* round to nearest even and saturate, as lrintf and saturate8 below do */
        __m256 v[4], magnitude = _mm256_setzero_ps(), total = _mm256_setzero_ps();
        const __m256 sign_bit = _mm256_set1_ps(-0.0f);
        for (int c = 0; c < 4; c++) {
            v[c] = _mm256_loadu_ps(values + 8 * c);
            magnitude = _mm256_max_ps(magnitude, _mm256_andnot_ps(sign_bit, v[c]));
            total = _mm256_add_ps(total, v[c]);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(magnitude), _mm256_extractf128_ps(magnitude, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4), sum = ladle_sum256(total);
        const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i rounded[4], rest_codes[4];
        __m256 rest[4];
        for (int c = 0; c < 4; c++) {
            const __m256 scaled = _mm256_mul_ps(v[c], inverse);
            rounded[c] = _mm256_cvtps_epi32(scaled);
            rest[c] = _mm256_sub_ps(scaled, _mm256_cvtepi32_ps(rounded[c]));
        }
        _mm256_storeu_si256((__m256i *)codes, narrow32(rounded[0], rounded[1], rounded[2], rounded[3]));
        if (residual) {
            const __m256 times = _mm256_set1_ps(256.0f);
            for (int c = 0; c < 4; c++) rest_codes[c] = _mm256_cvtps_epi32(_mm256_mul_ps(rest[c], times));
            _mm256_storeu_si256((__m256i *)(residual + g * GROUP),
                                narrow32(rest_codes[0], rest_codes[1], rest_codes[2], rest_codes[3]));
        }
#else
        float amax = 0.0f, sum = 0.0f;
        for (int k = 0; k < GROUP; k++) {
            float magnitude = fabsf(values[k]);
            amax = magnitude > amax ? magnitude : amax;
            sum += values[k];
        }
        const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int k = 0; k < GROUP; k++) {
            const float scaled = values[k] * inverse;
            codes[k] = saturate8(scaled);
            if (residual)
                residual[g * GROUP + k] = saturate8((scaled - (float)lrintf(scaled)) * 256.0f);
        }
#endif
        d[g] = residual ? amax / 127.0f / 256.0f : amax / 127.0f;
        sums[g] = sum;
    }
}

typedef struct {
    const int8_t *q;           /* [m, padded] */
    const int8_t *residual;    /* [m, padded], or NULL: 8-bit activations */
    const float *d, *sums;     /* [m, groups], and PARAM_PAD floats after (vector loads) */
    int64_t m, padded, n;
    const uint8_t *codes;      /* [n, padded / 2] */
    const void *scale, *offset; /* [n, groups], float32 or float16 */
    int is_half;
    const float *bias;
    float *y;                  /* [m, n] */
    const int16_t *x16;        /* [m, padded]: 256 q + residual (AVX2's 8-bit weights), or NULL */
} gemm_job;

static inline float param(const gemm_job *job, const void *values, int64_t index) {
    return job->is_half ? ladle_half_to_float(((const uint16_t *)values)[index])
                        : ((const float *)values)[index];
}

/* values[start .. start + count) in float32 (the same values as `param`): float16 ones eight
 * at a time through F16C, where one scalar conversion each cost about as many instructions
 * per row as its integer dot products at one row of x (K = 576: 36 conversions against ~90). */
static void row_params(const gemm_job *job, const void *values, int64_t start, int64_t count,
                       float *out) {
    if (!job->is_half) {
        memcpy(out, (const float *)values + start, (size_t)count * sizeof(float));
        return;
    }
    const uint16_t *halves = (const uint16_t *)values + start;
    int64_t g = 0;
#if defined(__F16C__)
    for (; g + 8 <= count; g += 8)
        _mm256_storeu_ps(out + g, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(halves + g))));
#endif
    for (; g < count; g++) out[g] = ladle_half_to_float(halves[g]);
}

/* The group scales (and offsets, when the weight has them: o is read only then) of ROW_BLOCK
 * weight rows in float32, rows past n repeating the last one. */
static void block_params(const gemm_job *job, int64_t row, float s[ROW_BLOCK][PARAM_STRIDE],
                         float o[ROW_BLOCK][PARAM_STRIDE]) {
    const int64_t num_groups = job->padded / GROUP;
    for (int r = 0; r < ROW_BLOCK; r++) {
        const int64_t n = row + r < job->n ? row + r : job->n - 1;
        row_params(job, job->scale, n * num_groups, num_groups, s[r]);
        if (job->offset) row_params(job, job->offset, n * num_groups, num_groups, o[r]);
    }
}

#if defined(LADLE_AVX512_VNNI)

/* One 64-byte half-step: weight codes w[r] (unsigned, two groups: lanes 0-7 and 8-15 of the
 * int32 sums) against the activation codes at byte `column` of each x row, whose groups start
 * at `group`. */
/* 64 codes times 64 activation codes, 4 to an int32 lane; with the residual codes (16-bit
 * activations) 256 times that plus the residuals' products. */
static inline __attribute__((always_inline)) __m512i dot64(__m512i w, __m512i xq,
                                                          const int8_t *rest, int two_pass) {
    __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xq);
    if (!two_pass) return dot;
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 8), w, _mm512_loadu_si512(rest));
}

static inline __attribute__((always_inline)) void half_step(
    const gemm_job *job, int64_t x_row, int num_x, int two_pass, const __m512i w[ROW_BLOCK],
    const __m512 ws[ROW_BLOCK], int64_t column, int64_t group, __m512 acc[X_TILE][ROW_BLOCK]) {
    const int64_t num_groups = job->padded / GROUP;
    const __m512i split = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int i = 0; i < num_x; i++) {
        const int64_t xi = x_row + i;
        const __m512i xq = _mm512_loadu_si512(job->q + xi * job->padded + column);
        const int8_t *rest = two_pass ? job->residual + xi * job->padded + column : 0;
        /* the two groups' activation scales, each over 8 lanes */
        const __m512 xd =
            _mm512_permutexvar_ps(split, _mm512_loadu_ps(job->d + xi * num_groups + group));
        for (int r = 0; r < ROW_BLOCK; r++) {
            __m512 dot = _mm512_cvtepi32_ps(dot64(w[r], xq, rest, two_pass));
            acc[i][r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(ws[r], xd), acc[i][r]);
        }
    }
}

/* sums[i][r] = the code term of x row i and weight row r. A 64-byte load of codes holds the
 * low nibbles of groups p and p + 1 and the high nibbles of groups p + h and p + h + 1
 * (h = groups / 2), each pair of groups adjacent in x's own order; an odd h leaves one
 * 32-byte step at the end. */
static inline __attribute__((always_inline)) void micro_kernel(
    const gemm_job *job, int64_t x_row, int num_x, int two_pass, const uint8_t *rows[ROW_BLOCK],
    float s[ROW_BLOCK][PARAM_STRIDE], float sums[X_TILE][ROW_BLOCK]) {
    const int64_t num_groups = job->padded / GROUP, h = num_groups / 2;
    const __m512i low_mask = _mm512_set1_epi8(0x0F);
    const __m512i split = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[X_TILE][ROW_BLOCK];
    for (int i = 0; i < num_x; i++)
        for (int r = 0; r < ROW_BLOCK; r++) acc[i][r] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 2 <= h; p += 2) {
        __m512i w[ROW_BLOCK];
        __m512 ws[ROW_BLOCK];
        for (int r = 0; r < ROW_BLOCK; r++) {
            w[r] = _mm512_and_si512(_mm512_loadu_si512(rows[r] + 32 * p), low_mask);
            ws[r] = _mm512_permutexvar_ps(split, _mm512_loadu_ps(&s[r][p]));
        }
        half_step(job, x_row, num_x, two_pass, w, ws, 32 * p, p, acc);
        for (int r = 0; r < ROW_BLOCK; r++) {
            __m512i packed = _mm512_loadu_si512(rows[r] + 32 * p);
            w[r] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_mask);
            ws[r] = _mm512_permutexvar_ps(split, _mm512_loadu_ps(&s[r][p + h]));
        }
        half_step(job, x_row, num_x, two_pass, w, ws, 32 * (p + h), p + h, acc);
    }
    if (p < h) { /* the last 32 bytes: group p (low nibbles) and group p + h (high) */
        const __m256i mask256 = _mm256_set1_epi8(0x0F);
        __m512i w[ROW_BLOCK];
        __m512 ws[ROW_BLOCK];
        for (int r = 0; r < ROW_BLOCK; r++) {
            __m256i packed = _mm256_loadu_si256((const __m256i *)(rows[r] + 32 * p));
            __m256i low = _mm256_and_si256(packed, mask256);
            __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask256);
            w[r] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
            ws[r] = _mm512_mask_broadcastss_ps(_mm512_set1_ps(s[r][p]), 0xFF00,
                                               _mm_set_ss(s[r][p + h]));
        }
        for (int i = 0; i < num_x; i++) {
            const int64_t xi = x_row + i;
            const int8_t *q = job->q + xi * job->padded;
            const __m512i xq = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q + 32 * p))),
                _mm256_loadu_si256((const __m256i *)(q + 32 * (p + h))), 1);
            int8_t rest[64];
            if (two_pass) {
                const int8_t *residual = job->residual + xi * job->padded;
                memcpy(rest, residual + 32 * p, 32);
                memcpy(rest + 32, residual + 32 * (p + h), 32);
            }
            const float *d = job->d + xi * num_groups;
            const __m512 xd = _mm512_mask_broadcastss_ps(_mm512_set1_ps(d[p]), 0xFF00,
                                                         _mm_set_ss(d[p + h]));
            for (int r = 0; r < ROW_BLOCK; r++) {
                __m512 dot = _mm512_cvtepi32_ps(dot64(w[r], xq, rest, two_pass));
                acc[i][r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(ws[r], xd), acc[i][r]);
            }
        }
    }
    for (int i = 0; i < num_x; i++)
        for (int r = 0; r < ROW_BLOCK; r++) sums[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

/* The batched path (INTERLEAVED_MIN_ROWS rows of x or more): the codes of 16 weight rows are
 * interleaved so that int32 lane l of a vector holds 4 codes of row l. Eight `vpdpbusd`s against
 * 4 broadcast activation codes each then leave a whole group's integer dot product of all 16
 * rows in one vector, and the group's scaling (convert, scale, fused multiply-add) is paid once
 * per group and 16 rows instead of once per 64 products (as micro_kernel above does): at 32 rows
 * of x that is ~2.5x fewer instructions. The interleaving (a transpose) is paid once per 16
 * weight rows and shared by all rows of x: level with micro_kernel at one row of x (which keeps
 * it), faster from two (docs/benchmarks.md, t12c2). */
#define LANES 16
#define INTERLEAVED_MIN_ROWS 2
#define INTERLEAVED_MAX_GROUPS 128 /* K up to 4096: the block's buffers stay on the stack */

/* out[j], int32 lane l: bytes at + 4 j .. + 3 of rows[l], for j < 8 and l < 16: a 16 x 8
 * transpose of 32-bit words in registers (two 8 x 8 ones side by side, rows l and l + 8 in the
 * two 256-bit halves), ~40 instructions where 8 gathers of 16 words each cost ~3x more. */
static inline void transpose16x8(const uint8_t *rows[LANES], int64_t at, __m512i out[8]) {
    __m512i z[8], t[8], u[8];
    for (int k = 0; k < 8; k++)
        z[k] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rows[k] + at))),
            _mm256_loadu_si256((const __m256i *)(rows[k + 8] + at)), 1);
    for (int k = 0; k < 8; k += 2) { /* per 128-bit lane: words 0, 1 and 2, 3 of rows k, k + 1 */
        t[k] = _mm512_unpacklo_epi32(z[k], z[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(z[k], z[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) { /* per 128-bit lane: word e of rows k .. k + 3 */
        u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);     /* e = 0 */
        u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]); /* e = 1 */
        u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    /* u[e] (rows 0-3) and u[4 + e] (rows 4-7) hold, by 128-bit lane, word e of rows 0-3 / 4-7,
     * word 4 + e of the same, word e of rows 8-11 / 12-15, word 4 + e of those */
    const __m512i low = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    const __m512i high = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int e = 0; e < 4; e++) {
        out[e] = _mm512_permutex2var_epi64(u[e], low, u[4 + e]);
        out[4 + e] = _mm512_permutex2var_epi64(u[e], high, u[4 + e]);
    }
}

/* The 16 weight rows from `row` (rows past n repeat the last), `row_bytes` apart. */
static inline void block_rows(const gemm_job *job, int64_t row, int64_t row_bytes,
                              const uint8_t *rows[LANES]) {
    for (int l = 0; l < LANES; l++)
        rows[l] = job->codes + (row + l < job->n ? row + l : job->n - 1) * row_bytes;
}

/* codes[p * 8 + j], lane l: bytes 32 p + 4 j .. + 3 of weight row `row` + l; the low nibbles
 * are 4 codes of group p, the high ones of group p + h. */
static void interleave_codes(const gemm_job *job, int64_t row, __m512i *codes) {
    const int64_t num_steps = job->padded / 64;
    const uint8_t *rows[LANES];
    block_rows(job, row, job->padded / 2, rows);
    for (int64_t p = 0; p < num_steps; p++) transpose16x8(rows, 32 * p, codes + p * 8);
}

/* scales[g * 16 + l] (and offsets) of weight row `row` + l, float32 */
static void interleave_params(const gemm_job *job, int64_t row, float *scales, float *offsets) {
    const int64_t num_groups = job->padded / GROUP;
    for (int l = 0; l < LANES; l++) {
        const int64_t n = row + l < job->n ? row + l : job->n - 1;
        for (int64_t g = 0; g < num_groups; g++) {
            scales[g * LANES + l] = param(job, job->scale, n * num_groups + g);
            if (job->offset) offsets[g * LANES + l] = param(job, job->offset, n * num_groups + g);
        }
    }
}

/* The 4-activation-code word at byte `at` of an int8 row, broadcast to every lane. */
static inline __m512i broadcast4(const int8_t *values, int64_t at) {
    int32_t word;
    memcpy(&word, values + at, 4);
    return _mm512_set1_epi32(word);
}

/* out[i] lane l = x row x_row + i times weight row `row` + l (offset term included) */
static inline __attribute__((always_inline)) void interleaved_tile(
    const gemm_job *job, int64_t x_row, int num_x, int two_pass, const __m512i *codes,
    const float *scales, const float *offsets, __m512 out[X_TILE]) {
    const int64_t num_groups = job->padded / GROUP, h = num_groups / 2;
    const __m512i low_mask = _mm512_set1_epi8(0x0F);
    __m512 acc[X_TILE];
    for (int i = 0; i < num_x; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < num_groups; g++) {
        const int64_t step = g < h ? g : g - h;
        __m512i w[8];
        for (int j = 0; j < 8; j++)
            w[j] = g < h ? _mm512_and_si512(codes[step * 8 + j], low_mask)
                         : _mm512_and_si512(_mm512_srli_epi16(codes[step * 8 + j], 4), low_mask);
        const __m512 s = _mm512_loadu_ps(scales + g * LANES);
        for (int i = 0; i < num_x; i++) {
            const int64_t xi = x_row + i;
            const int8_t *q = job->q + xi * job->padded + g * GROUP;
            __m512i dot = _mm512_setzero_si512(), rest_dot = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) dot = _mm512_dpbusd_epi32(dot, w[j], broadcast4(q, 4 * j));
            if (two_pass) {
                const int8_t *rest = job->residual + xi * job->padded + g * GROUP;
                for (int j = 0; j < 8; j++)
                    rest_dot = _mm512_dpbusd_epi32(rest_dot, w[j], broadcast4(rest, 4 * j));
                dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), rest_dot);
            }
            const __m512 xd = _mm512_set1_ps(job->d[xi * num_groups + g]);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, xd), acc[i]);
            if (job->offset)
                acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(offsets + g * LANES),
                                         _mm512_set1_ps(job->sums[xi * num_groups + g]), acc[i]);
        }
    }
    for (int i = 0; i < num_x; i++) out[i] = acc[i];
}

static void interleaved_chunk(const void *args, int64_t chunk) {
    const gemm_job *job = args;
    int64_t first, last;
    ladle_chunk_blocks(chunk, (job->n + LANES - 1) / LANES, 1, &first, &last);
    __m512i codes[INTERLEAVED_MAX_GROUPS / 2 * 8]; /* 32 KiB */
    float scales[INTERLEAVED_MAX_GROUPS * LANES], offsets[INTERLEAVED_MAX_GROUPS * LANES];
    for (int64_t block = first; block < last; block++) {
        const int64_t row = block * LANES;
        const int rows_here = job->n - row < LANES ? (int)(job->n - row) : LANES;
        const __mmask16 store = (__mmask16)((1u << rows_here) - 1u);
        const __m512 bias =
            job->bias ? _mm512_maskz_loadu_ps(store, job->bias + row) : _mm512_setzero_ps();
        interleave_codes(job, row, codes);
        interleave_params(job, row, scales, offsets);
        for (int64_t x_row = 0; x_row < job->m; x_row += X_TILE) {
            const int num_x = job->m - x_row < X_TILE ? (int)(job->m - x_row) : X_TILE;
            __m512 out[X_TILE];
            switch (num_x + (job->residual ? X_TILE : 0)) {
            case 1: interleaved_tile(job, x_row, 1, 0, codes, scales, offsets, out); break;
            case 2: interleaved_tile(job, x_row, 2, 0, codes, scales, offsets, out); break;
            case 3: interleaved_tile(job, x_row, 3, 0, codes, scales, offsets, out); break;
            case 4: interleaved_tile(job, x_row, 4, 0, codes, scales, offsets, out); break;
            case 5: interleaved_tile(job, x_row, 1, 1, codes, scales, offsets, out); break;
            case 6: interleaved_tile(job, x_row, 2, 1, codes, scales, offsets, out); break;
            case 7: interleaved_tile(job, x_row, 3, 1, codes, scales, offsets, out); break;
            default: interleaved_tile(job, x_row, 4, 1, codes, scales, offsets, out); break;
            }
            for (int i = 0; i < num_x; i++)
                _mm512_mask_storeu_ps(job->y + (x_row + i) * job->n + row, store,
                                      _mm512_add_ps(out[i], bias));
        }
    }
}

/* 8-bit weight codes (GGUF Q8_0: int8, a scale per group of 32, no offset), interleaved as
 * above: the default model's tied LM head. `vpdpbusd` multiplies unsigned by signed bytes, so
 * here the activation codes are the unsigned side, shifted by 128 (q8_int8_gemm flips their
 * sign bits), and 128 times each group's sum of weight codes comes off the integer sum. */
static void interleave_codes8(const gemm_job *job, int64_t row, __m512i *codes,
                              __m512i *code_sums) {
    const int64_t num_groups = job->padded / GROUP;
    const __m512i ones = _mm512_set1_epi8(1);
    const uint8_t *rows[LANES];
    block_rows(job, row, job->padded, rows);
    for (int64_t g = 0; g < num_groups; g++) {
        transpose16x8(rows, 32 * g, codes + g * 8);
        __m512i sum = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) sum = _mm512_dpbusd_epi32(sum, ones, codes[g * 8 + j]);
        code_sums[g] = sum;
    }
}

static inline __attribute__((always_inline)) void interleaved8_tile(
    const gemm_job *job, int64_t x_row, int num_x, int two_pass, const __m512i *codes,
    const __m512i *code_sums, const float *scales, __m512 out[X_TILE]) {
    const int64_t num_groups = job->padded / GROUP;
    __m512 acc[X_TILE];
    for (int i = 0; i < num_x; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < num_groups; g++) {
        const __m512i *w = codes + g * 8;
        /* (q + 128) w summed is the dot plus 128 sum(w); with the residual pass (r + 128) too,
         * 256 of the first and one of the second: 257 * 128 sum(w) */
        const __m512i shift =
            _mm512_mullo_epi32(code_sums[g], _mm512_set1_epi32(two_pass ? 257 * 128 : 128));
        const __m512 s = _mm512_loadu_ps(scales + g * LANES);
        for (int i = 0; i < num_x; i++) {
            const int64_t xi = x_row + i;
            const int8_t *q = job->q + xi * job->padded + g * GROUP;
            __m512i dot = _mm512_setzero_si512(), rest_dot = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) dot = _mm512_dpbusd_epi32(dot, broadcast4(q, 4 * j), w[j]);
            if (two_pass) {
                const int8_t *rest = job->residual + xi * job->padded + g * GROUP;
                for (int j = 0; j < 8; j++)
                    rest_dot = _mm512_dpbusd_epi32(rest_dot, broadcast4(rest, 4 * j), w[j]);
                dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), rest_dot);
            }
            dot = _mm512_sub_epi32(dot, shift);
            const __m512 xd = _mm512_set1_ps(job->d[xi * num_groups + g]);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, xd), acc[i]);
        }
    }
    for (int i = 0; i < num_x; i++) out[i] = acc[i];
}

static void interleaved8_chunk(const void *args, int64_t chunk) {
    const gemm_job *job = args;
    int64_t first, last;
    ladle_chunk_blocks(chunk, (job->n + LANES - 1) / LANES, 1, &first, &last);
    __m512i codes[INTERLEAVED_MAX_GROUPS * 8], code_sums[INTERLEAVED_MAX_GROUPS]; /* 72 KiB */
    float scales[INTERLEAVED_MAX_GROUPS * LANES], unused[INTERLEAVED_MAX_GROUPS * LANES];
    for (int64_t block = first; block < last; block++) {
        const int64_t row = block * LANES;
        const int rows_here = job->n - row < LANES ? (int)(job->n - row) : LANES;
        const __mmask16 store = (__mmask16)((1u << rows_here) - 1u);
        const __m512 bias =
            job->bias ? _mm512_maskz_loadu_ps(store, job->bias + row) : _mm512_setzero_ps();
        interleave_codes8(job, row, codes, code_sums);
        interleave_params(job, row, scales, unused);
        for (int64_t x_row = 0; x_row < job->m; x_row += X_TILE) {
            const int num_x = job->m - x_row < X_TILE ? (int)(job->m - x_row) : X_TILE;
            __m512 out[X_TILE];
            switch (num_x + (job->residual ? X_TILE : 0)) {
            case 1: interleaved8_tile(job, x_row, 1, 0, codes, code_sums, scales, out); break;
            case 2: interleaved8_tile(job, x_row, 2, 0, codes, code_sums, scales, out); break;
            case 3: interleaved8_tile(job, x_row, 3, 0, codes, code_sums, scales, out); break;
            case 4: interleaved8_tile(job, x_row, 4, 0, codes, code_sums, scales, out); break;
            case 5: interleaved8_tile(job, x_row, 1, 1, codes, code_sums, scales, out); break;
            case 6: interleaved8_tile(job, x_row, 2, 1, codes, code_sums, scales, out); break;
            case 7: interleaved8_tile(job, x_row, 3, 1, codes, code_sums, scales, out); break;
            default: interleaved8_tile(job, x_row, 4, 1, codes, code_sums, scales, out); break;
            }
            for (int i = 0; i < num_x; i++)
                _mm512_mask_storeu_ps(job->y + (x_row + i) * job->n + row, store,
                                      _mm512_add_ps(out[i], bias));
        }
    }
}

#elif defined(LADLE_AVX2) || defined(LADLE_AVX512) /* AVX-512 without VNNI: its AVX2 */

/* 32 unsigned codes times 32 signed activations, 4 to an int32 lane; with the residual codes
 * (16-bit activations) 256 times that plus the residuals' products. */
static inline __attribute__((always_inline)) __m256i dot32_pass(__m256i codes, const int8_t *q,
                                                               const int8_t *rest, int two_pass) {
    const __m256i xq = _mm256_loadu_si256((const __m256i *)q);
#if defined(LADLE_VNNI256)
    const __m256i dot = ladle_dpbusd256(_mm256_setzero_si256(), codes, xq);
    if (!two_pass) return dot;
    return ladle_dpbusd256(_mm256_slli_epi32(dot, 8), codes,
                           _mm256_loadu_si256((const __m256i *)rest));
#else
    /* 15 * 128 * 2 fits in int16: vpmaddubsw cannot saturate here; vpmaddwd then widens the
     * pairs to int32, times 256 for the first pass (no separate shift). */
    const __m256i pairs = _mm256_maddubs_epi16(codes, xq);
    if (!two_pass) return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    const __m256i rest_pairs =
        _mm256_maddubs_epi16(codes, _mm256_loadu_si256((const __m256i *)rest));
    return _mm256_add_epi32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(rest_pairs, _mm256_set1_epi16(1)));
#endif
}

/* One weight row at a time against the tile's x rows, the low and high nibbles' groups in two
 * accumulators each: 2 * X_TILE accumulators fit AVX2's 16 registers (all rows of the block at
 * once, 16 accumulators and the codes, spilled at X_TILE = 4), and each code byte is still read
 * once. The group scales' products s * d are formed 8 at a time before the loop. */
static inline __attribute__((always_inline)) void micro_kernel(
    const gemm_job *job, int64_t x_row, int num_x, int two_pass, const uint8_t *rows[ROW_BLOCK],
    float s[ROW_BLOCK][PARAM_STRIDE], float sums[X_TILE][ROW_BLOCK]) {
    const int64_t num_groups = job->padded / GROUP, half_groups = num_groups / 2;
    const __m256i low_mask = _mm256_set1_epi8(0x0F);
    float sd[X_TILE][PARAM_STRIDE];
    for (int r = 0; r < ROW_BLOCK; r++) {
        for (int i = 0; i < num_x; i++) {
            const float *d = job->d + (x_row + i) * num_groups; /* PARAM_PAD floats after */
            for (int64_t g = 0; g < num_groups; g += 8)
                _mm256_storeu_ps(&sd[i][g],
                                 _mm256_mul_ps(_mm256_loadu_ps(&s[r][g]), _mm256_loadu_ps(d + g)));
        }
        __m256 acc_low[X_TILE], acc_high[X_TILE];
        for (int i = 0; i < num_x; i++) acc_low[i] = acc_high[i] = _mm256_setzero_ps();
        for (int64_t p = 0; p < half_groups; p++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(rows[r] + 32 * p));
            const __m256i low = _mm256_and_si256(packed, low_mask);
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
            const int64_t at_low = 32 * p, at_high = 32 * (p + half_groups);
            for (int i = 0; i < num_x; i++) {
                const int64_t xi = x_row + i;
                const int8_t *q = job->q + xi * job->padded;
                const int8_t *rest = two_pass ? job->residual + xi * job->padded : q;
                const __m256 dot_low =
                    _mm256_cvtepi32_ps(dot32_pass(low, q + at_low, rest + at_low, two_pass));
                const __m256 dot_high =
                    _mm256_cvtepi32_ps(dot32_pass(high, q + at_high, rest + at_high, two_pass));
                acc_low[i] = _mm256_fmadd_ps(dot_low, _mm256_broadcast_ss(&sd[i][p]), acc_low[i]);
                acc_high[i] = _mm256_fmadd_ps(
                    dot_high, _mm256_broadcast_ss(&sd[i][p + half_groups]), acc_high[i]);
            }
        }
        for (int i = 0; i < num_x; i++)
            sums[i][r] = ladle_sum256(_mm256_add_ps(acc_low[i], acc_high[i]));
    }
}

#if defined(LADLE_AVX2)
#include "interleaved_avx2.h"
#endif

#else

static inline void micro_kernel(const gemm_job *job, int64_t x_row, int num_x, int two_pass,
                                const uint8_t *rows[ROW_BLOCK], float s[ROW_BLOCK][PARAM_STRIDE],
                                float sums[X_TILE][ROW_BLOCK]) {
    const int64_t num_groups = job->padded / GROUP, half_groups = num_groups / 2;
    for (int i = 0; i < num_x; i++) {
        const int64_t xi = x_row + i;
        const float *d = job->d + xi * num_groups;
        for (int r = 0; r < ROW_BLOCK; r++) {
            float total = 0.0f;
            for (int64_t g = 0; g < num_groups; g++) {
                const int8_t *q = job->q + xi * job->padded + g * GROUP;
                const uint8_t *packed = rows[r] + 32 * (g % half_groups);
                const int shift = g < half_groups ? 0 : 4;
                int32_t dot = 0;
                for (int k = 0; k < GROUP; k++) dot += ((packed[k] >> shift) & 0x0F) * q[k];
                if (two_pass) {
                    const int8_t *rest = job->residual + xi * job->padded + g * GROUP;
                    int32_t rest_dot = 0;
                    for (int k = 0; k < GROUP; k++)
                        rest_dot += ((packed[k] >> shift) & 0x0F) * rest[k];
                    dot = dot * 256 + rest_dot;
                }
                total += (float)dot * s[r][g] * d[g];
            }
            sums[i][r] = total;
        }
    }
}

#endif

static void gemm_chunk(const void *args, int64_t chunk) {
    const gemm_job *job = args;
    const int64_t num_groups = job->padded / GROUP, row_bytes = job->padded / 2;
    float s[ROW_BLOCK][PARAM_STRIDE], o[ROW_BLOCK][PARAM_STRIDE];
    int64_t first, last;
    ladle_chunk_blocks(chunk, (job->n + ROW_BLOCK - 1) / ROW_BLOCK, BLOCKS_PER_CHUNK, &first,
                       &last);
    for (int64_t block = first; block < last; block++) {
        const int64_t row = block * ROW_BLOCK;
        const int rows_here = job->n - row < ROW_BLOCK ? (int)(job->n - row) : ROW_BLOCK;
        const uint8_t *rows[ROW_BLOCK];
        for (int r = 0; r < ROW_BLOCK; r++)
            rows[r] = job->codes + (r < rows_here ? row + r : job->n - 1) * row_bytes;
        block_params(job, row, s, o);
        for (int64_t x_row = 0; x_row < job->m; x_row += X_TILE) {
            const int num_x = job->m - x_row < X_TILE ? (int)(job->m - x_row) : X_TILE;
            float sums[X_TILE][ROW_BLOCK];
            /* constant tile heights, so the accumulators stay in registers */
            switch (num_x + (job->residual ? X_TILE : 0)) {
            case 1: micro_kernel(job, x_row, 1, 0, rows, s, sums); break;
            case 2: micro_kernel(job, x_row, 2, 0, rows, s, sums); break;
            case 3: micro_kernel(job, x_row, 3, 0, rows, s, sums); break;
            case 4: micro_kernel(job, x_row, 4, 0, rows, s, sums); break;
            case 5: micro_kernel(job, x_row, 1, 1, rows, s, sums); break;
            case 6: micro_kernel(job, x_row, 2, 1, rows, s, sums); break;
            case 7: micro_kernel(job, x_row, 3, 1, rows, s, sums); break;
            default: micro_kernel(job, x_row, 4, 1, rows, s, sums); break;
            }
            for (int i = 0; i < num_x; i++) {
                const float *x_sums = job->sums + (x_row + i) * num_groups;
                for (int r = 0; r < rows_here; r++) {
                    float total = sums[i][r];
                    if (job->offset) {
                        float offsets = 0.0f;
#pragma omp simd reduction(+ : offsets)
                        for (int64_t g = 0; g < num_groups; g++) offsets += o[r][g] * x_sums[g];
                        total += offsets;
                    }
                    if (job->bias) total += job->bias[row + r];
                    job->y[(x_row + i) * job->n + row + r] = total;
                }
            }
        }
    }
}

typedef struct {
    const float *x;
    int64_t padded;
    int8_t *q, *residual;
    float *d, *sums;
} quantize_job;

static void quantize_chunk(const void *args, int64_t row) {
    const quantize_job *job = args;
    const int64_t num_groups = job->padded / GROUP;
    quantize_row(job->x + row * job->padded, num_groups, job->q + row * job->padded,
                 job->residual ? job->residual + row * job->padded : 0,
                 job->d + row * num_groups, job->sums + row * num_groups);
}

/* x: float32 [m, padded] (zero past the real columns); y: float32 [m, n]; activation_bits 8
 * (one code per activation) or 16 (a code and a residual code: two integer passes). Returns 0,
 * -1 for arguments outside what this kernel handles (nothing written), -2 when out of memory. */
int ladle_q4_int8_gemm(const float *x, int64_t m, int64_t padded, int64_t activation_bits,
                       const uint8_t *codes, const void *scale, const void *offset,
                       int64_t scale_is_half, const float *bias, float *y, int64_t n,
                       int64_t num_threads) {
    const int64_t num_groups = padded / GROUP;
    if (m < 1 || n < 1 || padded % (2 * GROUP) || num_groups > MAX_GROUPS) return -1;
    if (activation_bits != 8 && activation_bits != 16) return -1;
    const int64_t copies = activation_bits / 8;
    int8_t *q = aligned_alloc(64, (size_t)((copies * m * padded + 63) / 64 * 64));
    float *params = calloc((size_t)(2 * m * num_groups + PARAM_PAD), sizeof(float));
    if (!q || !params) {
        free(q);
        free(params);
        return -2;
    }
    const int64_t threads = n * padded * m >= MIN_PARALLEL_WORK ? num_threads : 1;
    int8_t *residual = copies == 2 ? q + m * padded : 0;
    quantize_job quantize = {x, padded, q, residual, params, params + m * num_groups};
    ladle_run_chunks(quantize_chunk, &quantize, m, m >= 16 ? threads : 1);
    gemm_job job = {q, residual, params, params + m * num_groups, m, padded, n, codes,
                    scale, offset, (int)scale_is_half, bias, y, 0};
#if defined(LADLE_AVX512_VNNI)
    if (m >= INTERLEAVED_MIN_ROWS && num_groups <= INTERLEAVED_MAX_GROUPS) {
        ladle_run_chunks(interleaved_chunk, &job, (n + LANES - 1) / LANES, threads);
        free(q);
        free(params);
        return 0;
    }
#elif defined(LADLE_AVX2)
    if (m >= AVX2_INTERLEAVED_MIN_ROWS && num_groups <= AVX2_INTERLEAVED_MAX_GROUPS) {
        ladle_run_chunks(avx2_interleaved_chunk, &job, (n + LANES8 - 1) / LANES8, threads);
        free(q);
        free(params);
        return 0;
    }
#endif
    const int64_t num_blocks = (n + ROW_BLOCK - 1) / ROW_BLOCK;
    ladle_run_chunks(gemm_chunk, &job, (num_blocks + BLOCKS_PER_CHUNK - 1) / BLOCKS_PER_CHUNK,
                     threads);
    free(q);
    free(params);
    return 0;
}

/* As ladle_q4_int8_gemm for 8-bit weight codes (int8 [n, padded], a scale per group of 32, no
 * offset: GGUF Q8_0). Only interleaved paths exist for them (AVX-512 VNNI, and AVX2:
 * interleaved_avx2.h): returns -1 (nothing written) on other builds and below their minimum rows
 * (2), where the caller's float paths are as fast. */
int ladle_q8_int8_gemm(const float *x, int64_t m, int64_t padded, int64_t activation_bits,
                       const int8_t *codes, const void *scale, int64_t scale_is_half,
                       const float *bias, float *y, int64_t n, int64_t num_threads) {
#if defined(LADLE_AVX512_VNNI)
    const int64_t num_groups = padded / GROUP;
    if (m < INTERLEAVED_MIN_ROWS || n < 1 || padded % GROUP || num_groups > INTERLEAVED_MAX_GROUPS)
        return -1;
    if (activation_bits != 8 && activation_bits != 16) return -1;
    const int64_t copies = activation_bits / 8;
    int8_t *q = aligned_alloc(64, (size_t)((copies * m * padded + 63) / 64 * 64));
    float *params = calloc((size_t)(2 * m * num_groups + PARAM_PAD), sizeof(float));
    if (!q || !params) {
        free(q);
        free(params);
        return -2;
    }
    const int64_t threads = n * padded * m >= MIN_PARALLEL_WORK ? num_threads : 1;
    int8_t *residual = copies == 2 ? q + m * padded : 0;
    quantize_job quantize = {x, padded, q, residual, params, params + m * num_groups};
    ladle_run_chunks(quantize_chunk, &quantize, m, m >= 16 ? threads : 1);
    /* the unsigned side of vpdpbusd: code + 128, i.e. the sign bit flipped */
    const __m512i sign = _mm512_set1_epi8((char)0x80);
    for (int64_t at = 0; at < copies * m * padded; at += 64) {
        __m512i *codes64 = (__m512i *)(q + at);
        if (at + 64 <= copies * m * padded)
            *codes64 = _mm512_xor_si512(*codes64, sign);
        else
            for (int64_t k = at; k < copies * m * padded; k++) q[k] ^= (int8_t)0x80;
    }
    gemm_job job = {q, residual, params, params + m * num_groups, m, padded, n,
                    (const uint8_t *)codes, scale, 0, (int)scale_is_half, bias, y, 0};
    ladle_run_chunks(interleaved8_chunk, &job, (n + LANES - 1) / LANES, threads);
    free(q);
    free(params);
    return 0;
#elif defined(LADLE_AVX2)
    const int64_t num_groups = padded / GROUP;
    if (m < AVX2_INTERLEAVED8_MIN_ROWS || n < 1 || padded % GROUP ||
        num_groups > AVX2_INTERLEAVED_MAX_GROUPS)
        return -1;
    if (activation_bits != 8 && activation_bits != 16) return -1;
    const int64_t copies = activation_bits / 8;
    int8_t *q = malloc((size_t)(copies * m * padded));
    int16_t *x16 = malloc((size_t)(m * padded) * sizeof(int16_t));
    float *params = calloc((size_t)(2 * m * num_groups + PARAM_PAD), sizeof(float));
    if (!q || !x16 || !params) {
        free(q);
        free(x16);
        free(params);
        return -2;
    }
    const int64_t threads = n * padded * m >= MIN_PARALLEL_WORK ? num_threads : 1;
    int8_t *residual = copies == 2 ? q + m * padded : 0;
    quantize_job quantize = {x, padded, q, residual, params, params + m * num_groups};
    ladle_run_chunks(quantize_chunk, &quantize, m, m >= 16 ? threads : 1);
    /* one int16 per activation: 256 q + r lies in [-32640, 32639] */
    for (int64_t k = 0; k < m * padded; k++)
        x16[k] = (int16_t)(residual ? 256 * q[k] + residual[k] : q[k]);
    gemm_job job = {q, residual, params, params + m * num_groups, m, padded, n,
                    (const uint8_t *)codes, scale, 0, (int)scale_is_half, bias, y, x16};
    ladle_run_chunks(avx2_interleaved8_chunk, &job, (n + LANES8 - 1) / LANES8, threads);
    free(q);
    free(x16);
    free(params);
    return 0;
#else
    (void)x, (void)m, (void)padded, (void)activation_bits, (void)codes, (void)scale;
    (void)scale_is_half, (void)bias, (void)y, (void)n, (void)num_threads;
    return -1;
#endif
}

/* 1 where this build has the interleaved path (AVX-512 VNNI), which beats MKL on dequantized
 * chunks at every batch measured (up to 512 rows: docs/benchmarks.md), so prefill takes it too;
 * 0 where only micro_kernel is built (MKL overtakes it between 48 and 64 rows). */
int64_t ladle_q4_int8_gemm_interleaved(void) {
#if defined(LADLE_AVX512_VNNI)
    return 1;
#else
    return 0;
#endif
}
