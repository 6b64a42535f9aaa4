/* Weight-only int8 matrix-vector product for decode on the CPU:
 *
 *     y[i][n] = scale[n] * sum_k x[i][k] * codes[n][k]  (+ bias[n]),   i < num_x_rows <= 4
 *
 * x, scale, bias and y are float32; codes are int8, one row per output. The codes are read once
 * and widened to float32 in registers, so each weight costs one byte of memory traffic: at batch
 * 1 a decode step is a stream over every weight, and the byte count sets its speed.
 * Output rows are shared out in chunks by thread_pool.c. Paths (simd_level.h): AVX-512, AVX2
 * with FMA, plain C.
 */
#include <stdint.h>

#include "thread_pool.h"
#include "simd_level.h"
#include "vector_sum.h"

#define MAX_X_ROWS 4
/* Output rows computed together: independent accumulators hide the FMA latency. */
#define ROW_BLOCK 4
/* Below this many weights one thread is faster than waking the team. */
#define MIN_PARALLEL_WEIGHTS (1 << 17)

#if defined(LADLE_AVX512)

static inline __m512 widen_codes(__mmask16 mask, const int8_t *codes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, codes)));
}

/* ROW_BLOCK output rows starting at `row` against num_x_rows rows of x. */
static inline __attribute__((always_inline)) void row_block(
    const float *x, int num_x_rows, int64_t k, const int8_t *codes, int64_t row,
    int num_rows_here, float sums[MAX_X_ROWS][ROW_BLOCK]) {
    __m512 acc[MAX_X_ROWS][ROW_BLOCK];
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < ROW_BLOCK; r++) acc[i][r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j += 16) {
        __mmask16 mask = k - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - j)) - 1);
        __m512 xv[MAX_X_ROWS];
        for (int i = 0; i < num_x_rows; i++) xv[i] = _mm512_maskz_loadu_ps(mask, x + i * k + j);
        for (int r = 0; r < num_rows_here; r++) {
            __m512 wv = widen_codes(mask, codes + (row + r) * k + j);
            for (int i = 0; i < num_x_rows; i++) acc[i][r] = _mm512_fmadd_ps(xv[i], wv, acc[i][r]);
        }
    }
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < num_rows_here; r++) sums[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

#elif defined(LADLE_AVX2)

/* AVX2: 8 columns to a vector, the last k % 8 in scalar code; the rows of the block are
 * independent accumulator chains. */
static inline __attribute__((always_inline)) void row_block(
    const float *x, int num_x_rows, int64_t k, const int8_t *codes, int64_t row,
    int num_rows_here, float sums[MAX_X_ROWS][ROW_BLOCK]) {
    __m256 acc[MAX_X_ROWS][ROW_BLOCK];
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < ROW_BLOCK; r++) acc[i][r] = _mm256_setzero_ps();
    const int64_t whole = k / 8 * 8;
    for (int64_t j = 0; j < whole; j += 8) {
        __m256 xv[MAX_X_ROWS];
        for (int i = 0; i < num_x_rows; i++) xv[i] = _mm256_loadu_ps(x + i * k + j);
        for (int r = 0; r < num_rows_here; r++) {
            const __m256 wv = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + (row + r) * k + j))));
            for (int i = 0; i < num_x_rows; i++) acc[i][r] = _mm256_fmadd_ps(xv[i], wv, acc[i][r]);
        }
    }
    for (int i = 0; i < num_x_rows; i++)
        for (int r = 0; r < num_rows_here; r++) {
            float sum = ladle_sum256(acc[i][r]);
            for (int64_t j = whole; j < k; j++) sum += x[i * k + j] * (float)codes[(row + r) * k + j];
            sums[i][r] = sum;
        }
}

#else

static inline void row_block(
    const float *x, int num_x_rows, int64_t k, const int8_t *codes, int64_t row,
    int num_rows_here, float sums[MAX_X_ROWS][ROW_BLOCK]) {
    for (int i = 0; i < num_x_rows; i++) {
        for (int r = 0; r < num_rows_here; r++) {
            const int8_t *w = codes + (row + r) * k;
            const float *xi = x + i * k;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < k; j++) sum += xi[j] * (float)w[j];
            sums[i][r] = sum;
        }
    }
}

#endif

/* Specialised per x-row count so the accumulator loops unroll. */
#define DEFINE_BLOCK_LOOP(NUM_X)                                                               \
    static void block_loop_##NUM_X(const float *x, int64_t k, const int8_t *codes,            \
                                   const float *scale, const float *bias, float *y, int64_t n, \
                                   int64_t block) {                                            \
        int64_t row = block * ROW_BLOCK;                                                       \
        int num_rows_here = n - row < ROW_BLOCK ? (int)(n - row) : ROW_BLOCK;                  \
        float sums[MAX_X_ROWS][ROW_BLOCK];                                                     \
        row_block(x, NUM_X, k, codes, row, num_rows_here, sums);                               \
        for (int i = 0; i < NUM_X; i++)                                                        \
            for (int r = 0; r < num_rows_here; r++)                                            \
                y[i * n + row + r] =                                                           \
                    sums[i][r] * scale[row + r] + (bias ? bias[row + r] : 0.0f);               \
    }
DEFINE_BLOCK_LOOP(1)
DEFINE_BLOCK_LOOP(2)
DEFINE_BLOCK_LOOP(3)
DEFINE_BLOCK_LOOP(4)

typedef struct {
    const float *x;
    int64_t num_x_rows, k, n;
    const int8_t *codes;
    const float *scale, *bias;
    float *y;
} gemv_job;

#define BLOCKS_PER_CHUNK 4

static void gemv_chunk(const void *args, int64_t chunk) {
    const gemv_job *job = args;
    int64_t first, last;
    ladle_chunk_blocks(chunk, (job->n + ROW_BLOCK - 1) / ROW_BLOCK, BLOCKS_PER_CHUNK, &first, &last);
    for (int64_t block = first; block < last; block++) {
        switch (job->num_x_rows) {
        case 1: block_loop_1(job->x, job->k, job->codes, job->scale, job->bias, job->y, job->n, block); break;
        case 2: block_loop_2(job->x, job->k, job->codes, job->scale, job->bias, job->y, job->n, block); break;
        case 3: block_loop_3(job->x, job->k, job->codes, job->scale, job->bias, job->y, job->n, block); break;
        default: block_loop_4(job->x, job->k, job->codes, job->scale, job->bias, job->y, job->n, block); break;
        }
    }
}

/* Returns 0, or -1 when num_x_rows is out of range (the caller then takes another path). */
int ladle_int8_gemv(const float *x, int64_t num_x_rows, int64_t k, const int8_t *codes,
                    const float *scale, const float *bias, float *y, int64_t n,
                    int64_t num_threads) {
    if (num_x_rows < 1 || num_x_rows > MAX_X_ROWS) return -1;
    gemv_job job = {x, num_x_rows, k, n, codes, scale, bias, y};
    int64_t num_blocks = (n + ROW_BLOCK - 1) / ROW_BLOCK;
    int64_t num_chunks = (num_blocks + BLOCKS_PER_CHUNK - 1) / BLOCKS_PER_CHUNK;
    ladle_run_chunks(gemv_chunk, &job, num_chunks, n * k >= MIN_PARALLEL_WEIGHTS ? num_threads : 1);
    return 0;
}
