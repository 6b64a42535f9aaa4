/* Group-quantized matrix-vector product for decode on the CPU (the layout of
 * ladle/model/layers/group_quant.py, which GGUF's Q4_0/Q4_1/Q4_K/Q8_0/Q6_K map onto):
 *
 *     w[n][k] = code[n][k] * scale[n][k / group] + offset[n][k / group]
 *     y[i][n] = sum_k x[i][k] * w[n][k]  (+ bias[n]),   i < num_x_rows <= 4
 *
 * 4-bit codes: byte j of a row holds column j (low nibble) and column j + padded / 2 (high).
 * 8-bit codes: one signed byte per column. Codes are widened and scaled in registers, so a
 * weight costs its own bits of memory traffic (plus its group's scale and offset, float32 or
 * float16: GGUF stores them in float16, so the half copies are exact and half the bytes), and the
 * activations stay float32: the result is the float32 product with the dequantized weight, up
 * to the order of the sums. Needs group % 16 == 0 (and, for 4 bits, padded % 32 == 0), so that
 * each 16-column vector lies in one group; the caller checks. Paths (simd_level.h): AVX-512,
 * AVX2 with FMA (F16C for float16 parameters where the build has it), plain C.
 */
#include <stdint.h>

#include "half_float.h"
#include "thread_pool.h"

#include "simd_level.h"
#include "vector_sum.h"

#define MAX_X_ROWS 4
#define ROW_BLOCK 4
#define MIN_PARALLEL_BYTES (1 << 16)

/* Group parameters are float32 or float16 (scale_is_half). */
typedef struct {
    const void *scale, *offset;
    int is_half;
} group_params;

static inline float param_at(const void *values, int is_half, int64_t index) {
    if (is_half) return ladle_half_to_float(((const uint16_t *)values)[index]);
    return ((const float *)values)[index];
}

#if defined(LADLE_AVX512)

/* The 16 weights of columns [column, column + 16) of one row, dequantized. */
static inline __m512 dequantize16(__m128i codes8, group_params params, int64_t group_index) {
    __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes8));
    __m512 scale_v = _mm512_set1_ps(param_at(params.scale, params.is_half, group_index));
    if (!params.offset) return _mm512_mul_ps(values, scale_v);
    __m512 offset_v = _mm512_set1_ps(param_at(params.offset, params.is_half, group_index));
    return _mm512_fmadd_ps(values, scale_v, offset_v);
}

static inline __attribute__((always_inline)) void row_block(
    const float *x, int num_x_rows, int64_t padded, int bits, int64_t group,
    const uint8_t *codes, group_params params, int64_t row,
    int num_rows_here, float sums[MAX_X_ROWS][ROW_BLOCK]) {
    const int64_t num_groups = padded / group;
    const int64_t row_bytes = padded * bits / 8;
    __m512 acc[MAX_X_ROWS][ROW_BLOCK];
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < ROW_BLOCK; r++) acc[i][r] = _mm512_setzero_ps();
    if (bits == 4) {
        const int64_t half = padded / 2;
        const __m128i low_mask = _mm_set1_epi8(0x0F);
        for (int64_t j = 0; j < half; j += 16) {
            __m512 x_low[MAX_X_ROWS], x_high[MAX_X_ROWS];
            for (int i = 0; i < num_x_rows; i++) {
                x_low[i] = _mm512_loadu_ps(x + i * padded + j);
                x_high[i] = _mm512_loadu_ps(x + i * padded + half + j);
            }
            for (int r = 0; r < num_rows_here; r++) {
                const int64_t n = row + r;
                __m128i packed = _mm_loadu_si128((const __m128i *)(codes + n * row_bytes + j));
                __m128i low = _mm_and_si128(packed, low_mask);
                __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
                __m512 w_low = dequantize16(low, params, n * num_groups + j / group);
                __m512 w_high = dequantize16(high, params, n * num_groups + (half + j) / group);
                for (int i = 0; i < num_x_rows; i++) {
                    acc[i][r] = _mm512_fmadd_ps(x_low[i], w_low, acc[i][r]);
                    acc[i][r] = _mm512_fmadd_ps(x_high[i], w_high, acc[i][r]);
                }
            }
        }
    } else {
        for (int64_t j = 0; j < padded; j += 16) {
            __m512 xv[MAX_X_ROWS];
            for (int i = 0; i < num_x_rows; i++) xv[i] = _mm512_loadu_ps(x + i * padded + j);
            for (int r = 0; r < num_rows_here; r++) {
                const int64_t n = row + r;
                __m128i codes8 = _mm_loadu_si128((const __m128i *)(codes + n * row_bytes + j));
                __m512 w = dequantize16(codes8, params, n * num_groups + j / group);
                for (int i = 0; i < num_x_rows; i++) acc[i][r] = _mm512_fmadd_ps(xv[i], w, acc[i][r]);
            }
        }
    }
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < num_rows_here; r++) sums[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

#elif defined(LADLE_AVX2)

/* AVX2: 8 columns to a vector. 8-bit codes without offsets (Q8_0, the LM head) sum x * code
 * over a group first and scale the group's sum once (two instructions per 8 weights, and one
 * per group); otherwise each 8 weights are dequantized (code * scale + offset) before the
 * multiply-add, as the AVX-512 path does. Rows of the block are interleaved so their
 * accumulators are independent chains (one row alone waits on its multiply-add's latency). */
static inline __m256 widen_signed8(const uint8_t *codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes)));
}

static inline __m256 widen_unsigned8(__m128i codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
}

static inline __attribute__((always_inline)) void row_block(
    const float *x, int num_x_rows, int64_t padded, int bits, int64_t group,
    const uint8_t *codes, group_params params, int64_t row,
    int num_rows_here, float sums[MAX_X_ROWS][ROW_BLOCK]) {
    const int64_t num_groups = padded / group;
    const int64_t row_bytes = padded * bits / 8;
    __m256 acc[MAX_X_ROWS][ROW_BLOCK];
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < ROW_BLOCK; r++) acc[i][r] = _mm256_setzero_ps();
    if (bits == 8 && !params.offset) {
        for (int64_t g = 0; g < num_groups; g++) {
            __m256 part[MAX_X_ROWS][ROW_BLOCK];
            for (int i = 0; i < num_x_rows; i++)
                for (int r = 0; r < ROW_BLOCK; r++) part[i][r] = _mm256_setzero_ps();
            for (int64_t j = g * group; j < (g + 1) * group; j += 8) {
                __m256 xv[MAX_X_ROWS];
                for (int i = 0; i < num_x_rows; i++) xv[i] = _mm256_loadu_ps(x + i * padded + j);
                for (int r = 0; r < num_rows_here; r++) {
                    const __m256 w = widen_signed8(codes + (row + r) * row_bytes + j);
                    for (int i = 0; i < num_x_rows; i++)
                        part[i][r] = _mm256_fmadd_ps(xv[i], w, part[i][r]);
                }
            }
            for (int r = 0; r < num_rows_here; r++) {
                const __m256 s = _mm256_set1_ps(
                    param_at(params.scale, params.is_half, (row + r) * num_groups + g));
                for (int i = 0; i < num_x_rows; i++)
                    acc[i][r] = _mm256_fmadd_ps(part[i][r], s, acc[i][r]);
            }
        }
    } else {
        const int64_t half = padded / 2;
        const __m128i low_mask = _mm_set1_epi8(0x0F);
        /* 8 columns at `column` (and, for 4 bits, 8 at half + column) per step */
        const int64_t end = bits == 4 ? half : padded;
        for (int64_t j = 0; j < end; j += 8) {
            __m256 x_first[MAX_X_ROWS], x_second[MAX_X_ROWS];
            for (int i = 0; i < num_x_rows; i++) {
                x_first[i] = _mm256_loadu_ps(x + i * padded + j);
                x_second[i] = bits == 4 ? _mm256_loadu_ps(x + i * padded + half + j)
                                        : _mm256_setzero_ps();
            }
            for (int r = 0; r < num_rows_here; r++) {
                const int64_t n = row + r, first_group = n * num_groups + j / group;
                const __m256 s = _mm256_set1_ps(param_at(params.scale, params.is_half, first_group));
                const __m256 o = params.offset
                    ? _mm256_set1_ps(param_at(params.offset, params.is_half, first_group))
                    : _mm256_setzero_ps();
                if (bits == 8) {
                    const __m256 w = _mm256_fmadd_ps(widen_signed8(codes + n * row_bytes + j), s, o);
                    for (int i = 0; i < num_x_rows; i++)
                        acc[i][r] = _mm256_fmadd_ps(x_first[i], w, acc[i][r]);
                    continue;
                }
                const __m128i packed = _mm_loadl_epi64((const __m128i *)(codes + n * row_bytes + j));
                const int64_t second_group = n * num_groups + (half + j) / group;
                const __m256 s2 = _mm256_set1_ps(param_at(params.scale, params.is_half, second_group));
                const __m256 o2 = params.offset
                    ? _mm256_set1_ps(param_at(params.offset, params.is_half, second_group))
                    : _mm256_setzero_ps();
                const __m256 w_low = _mm256_fmadd_ps(
                    widen_unsigned8(_mm_and_si128(packed, low_mask)), s, o);
                const __m256 w_high = _mm256_fmadd_ps(
                    widen_unsigned8(_mm_and_si128(_mm_srli_epi16(packed, 4), low_mask)), s2, o2);
                for (int i = 0; i < num_x_rows; i++) {
                    acc[i][r] = _mm256_fmadd_ps(x_first[i], w_low, acc[i][r]);
                    acc[i][r] = _mm256_fmadd_ps(x_second[i], w_high, acc[i][r]);
                }
            }
        }
    }
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < num_rows_here; r++) sums[i][r] = ladle_sum256(acc[i][r]);
}

#else

static inline float code_at(const uint8_t *row_codes, int bits, int64_t half, int64_t k) {
    if (bits == 8) return (float)(int8_t)row_codes[k];
    return (float)(k < half ? row_codes[k] & 0x0F : row_codes[k - half] >> 4);
}

static inline void row_block(const float *x, int num_x_rows, int64_t padded, int bits,
                             int64_t group, const uint8_t *codes, group_params params,
                             int64_t row, int num_rows_here,
                             float sums[MAX_X_ROWS][ROW_BLOCK]) {
    const int64_t num_groups = padded / group, row_bytes = padded * bits / 8, half = padded / 2;
    for (int i = 0; i < num_x_rows; i++) {
        for (int r = 0; r < num_rows_here; r++) {
            const int64_t n = row + r;
            float sum = 0.0f;
            for (int64_t k = 0; k < padded; k++) {
                int64_t g = n * num_groups + k / group;
                float w = code_at(codes + n * row_bytes, bits, half, k) *
                              param_at(params.scale, params.is_half, g) +
                          (params.offset ? param_at(params.offset, params.is_half, g) : 0.0f);
                sum += x[i * padded + k] * w;
            }
            sums[i][r] = sum;
        }
    }
}

#endif

#define DEFINE_BLOCK_LOOP(NUM_X)                                                               \
    static void block_loop_##NUM_X(const float *x, int64_t padded, int bits, int64_t group,   \
                                   const uint8_t *codes, group_params params,                 \
                                   const float *bias, float *y,                               \
                                   int64_t n, int64_t block) {                                 \
        int64_t row = block * ROW_BLOCK;                                                       \
        int num_rows_here = n - row < ROW_BLOCK ? (int)(n - row) : ROW_BLOCK;                  \
        float sums[MAX_X_ROWS][ROW_BLOCK];                                                     \
        row_block(x, NUM_X, padded, bits, group, codes, params, row, num_rows_here,           \
                  sums);                                                                       \
        for (int i = 0; i < NUM_X; i++)                                                        \
            for (int r = 0; r < num_rows_here; r++)                                            \
                y[i * n + row + r] = sums[i][r] + (bias ? bias[row + r] : 0.0f);               \
    }
DEFINE_BLOCK_LOOP(1)
DEFINE_BLOCK_LOOP(2)
DEFINE_BLOCK_LOOP(3)
DEFINE_BLOCK_LOOP(4)

typedef struct {
    const float *x;
    int64_t num_x_rows, padded, bits, group, n;
    const uint8_t *codes;
    group_params params;
    const float *bias;
    float *y;
} gemv_job;

/* One chunk: BLOCKS_PER_CHUNK blocks of ROW_BLOCK output rows. */
#define BLOCKS_PER_CHUNK 4

static void gemv_chunk(const void *args, int64_t chunk) {
    const gemv_job *job = args;
    int64_t first, last;
    ladle_chunk_blocks(chunk, (job->n + ROW_BLOCK - 1) / ROW_BLOCK, BLOCKS_PER_CHUNK, &first, &last);
    for (int64_t block = first; block < last; block++) {
        switch (job->num_x_rows) {
        case 1: block_loop_1(job->x, job->padded, (int)job->bits, job->group, job->codes, job->params, job->bias, job->y, job->n, block); break;
        case 2: block_loop_2(job->x, job->padded, (int)job->bits, job->group, job->codes, job->params, job->bias, job->y, job->n, block); break;
        case 3: block_loop_3(job->x, job->padded, (int)job->bits, job->group, job->codes, job->params, job->bias, job->y, job->n, block); break;
        default: block_loop_4(job->x, job->padded, (int)job->bits, job->group, job->codes, job->params, job->bias, job->y, job->n, block); break;
        }
    }
}

/* x: float32 [num_x_rows, padded] (zero past the real columns). Returns 0, or -1 when the
 * arguments are outside what this kernel handles. */
int ladle_group_gemv(const float *x, int64_t num_x_rows, int64_t padded, int64_t bits,
                     int64_t group, const uint8_t *codes, const void *scale,
                     const void *offset, int64_t scale_is_half, const float *bias, float *y,
                     int64_t n, int64_t num_threads) {
    if (num_x_rows < 1 || num_x_rows > MAX_X_ROWS || group % 16 || padded % group) return -1;
    if (bits != 4 && bits != 8) return -1;
    if (bits == 4 && padded % 32) return -1;
    gemv_job job = {x, num_x_rows, padded, bits, group, n, codes,
                    {scale, offset, (int)scale_is_half}, bias, y};
    int64_t num_blocks = (n + ROW_BLOCK - 1) / ROW_BLOCK;
    int64_t num_chunks = (num_blocks + BLOCKS_PER_CHUNK - 1) / BLOCKS_PER_CHUNK;
    int64_t threads = n * padded * bits / 8 >= MIN_PARALLEL_BYTES ? num_threads : 1;
    ladle_run_chunks(gemv_chunk, &job, num_chunks, threads);
    return 0;
}

/* Rows [row_start, row_start + num_rows) of the weight as float32 [num_rows, padded]: the
 * chunked dequantize-then-MKL path of prefill and batched decode, in one pass instead of
 * torch's five (unpack, convert, scale, offset, copy). Returns -1 (nothing written) for 4-bit
 * codes whose groups straddle the two nibble halves (an odd number of groups). */
int ladle_group_dequantize(const uint8_t *codes, const void *scale, const void *offset,
                            int64_t scale_is_half, int64_t padded, int64_t bits, int64_t group,
                            int64_t row_start, int64_t num_rows, float *out,
                            int64_t num_threads) {
    const int64_t num_groups = padded / group, row_bytes = padded * bits / 8, half = padded / 2;
    if ((bits != 4 && bits != 8) || padded % group || (bits == 4 && half % group)) return -1;
    int threads = num_rows * padded >= (1 << 16) && num_threads > 1 ? (int)num_threads : 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t r = 0; r < num_rows; r++) {
        const int64_t n = row_start + r;
        const uint8_t *row_codes = codes + n * row_bytes;
        float *values = out + r * padded;
        for (int64_t g = 0; g < num_groups; g++) {
            float s = param_at(scale, (int)scale_is_half, n * num_groups + g);
            float o = offset ? param_at(offset, (int)scale_is_half, n * num_groups + g) : 0.0f;
            const int64_t start = g * group, end = start + group;
            if (bits == 8) {
#pragma omp simd
                for (int64_t k = start; k < end; k++)
                    values[k] = (float)(int8_t)row_codes[k] * s + o;
            } else if (start < half) { /* each group lies wholly in one nibble half */
#pragma omp simd
                for (int64_t k = start; k < end; k++) values[k] = (float)(row_codes[k] & 0x0F) * s + o;
            } else {
#pragma omp simd
                for (int64_t k = start; k < end; k++)
                    values[k] = (float)(row_codes[k - half] >> 4) * s + o;
            }
        }
    }
    return 0;
}
