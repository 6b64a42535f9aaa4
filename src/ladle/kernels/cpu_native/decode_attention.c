/* Decode attention on the CPU: one query row per request over its cached keys and values,
 * read in place from the paged cache through a flat slot list (no gathered copy), softmax in
 * one pass over chunks of positions (a running maximum rescales the running sums once per
 * chunk), the query heads that share a kv head together, float32.
 *
 *     query   [num_requests, num_heads, head_dim]
 *     keys    [num_slots, num_kv_heads, head_dim]   (the cache's key half, flat over blocks)
 *     values  the same for the value half
 *     slots   [num_requests, max_context] int64: the cache slot of each context position
 *     lengths [num_requests] int64: each request's context length (<= max_context)
 *     out     [num_requests, num_heads, head_dim]
 *
 * Query head h reads kv head h / (num_heads / num_kv_heads) (grouped-query attention).
 */
#include <math.h>
#include <stdint.h>

#include "fast_exp.h"
#include "simd_level.h"
#include "thread_pool.h"
#include "vector_sum.h"

#define MAX_HEAD_DIM 256
#define MIN_PARALLEL_WORK (1 << 16)
/* Query heads attended together over one pass of their shared kv head's keys and values */
#define MAX_GROUP 8
/* Positions scored before their values are summed: the scores of a chunk sit in L1, and the
 * softmax's running maximum rescales the sums once per chunk instead of once per position. */
#define CHUNK 128

/* The two inner loops in AVX-512 or AVX2 registers (simd_level.h) where head_dim is a multiple
 * of 16 (the compiler's own vectorisation of them kept a lane array in memory and summed it one
 * float at a time); each returns 0 where it does not apply and the plain loops below run. */
#if defined(LADLE_AVX512)
static int score_vectors(const float *q, int heads, const float *keys, const int64_t *slots,
                         int64_t count, int64_t kv_stride, int64_t head_dim, float scale,
                         float scores[MAX_GROUP][CHUNK]) {
    if (head_dim % 16) return 0;
    for (int64_t t = 0; t < count; t++) {
        const float *k = keys + slots[t] * kv_stride;
        for (int h = 0; h < heads; h++) {
            const float *query = q + h * head_dim;
            __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(query), _mm512_loadu_ps(k));
            for (int64_t d = 16; d < head_dim; d += 16)
                sum = _mm512_fmadd_ps(_mm512_loadu_ps(query + d), _mm512_loadu_ps(k + d), sum);
            scores[h][t] = _mm512_reduce_add_ps(sum) * scale;
        }
    }
    return 1;
}

/* acc[h] += sum over t of weights[h][t] v_t, 16 dimensions at a time with every head's sums in
 * registers, so each value vector is loaded once. */
static int sum_vectors(int heads, const float *values, const int64_t *slots, int64_t count,
                       int64_t kv_stride, int64_t head_dim, float weights[MAX_GROUP][CHUNK],
                       float acc[MAX_GROUP][MAX_HEAD_DIM]) {
    if (head_dim % 16) return 0;
    for (int64_t d = 0; d < head_dim; d += 16) {
        __m512 sums[MAX_GROUP];
        for (int h = 0; h < heads; h++) sums[h] = _mm512_loadu_ps(&acc[h][d]);
        for (int64_t t = 0; t < count; t++) {
            const __m512 v = _mm512_loadu_ps(values + slots[t] * kv_stride + d);
            for (int h = 0; h < heads; h++)
                sums[h] = _mm512_fmadd_ps(_mm512_set1_ps(weights[h][t]), v, sums[h]);
        }
        for (int h = 0; h < heads; h++) _mm512_storeu_ps(&acc[h][d], sums[h]);
    }
    return 1;
}
#elif defined(LADLE_AVX2)
/* AVX2: the same two loops 8 dimensions at a time, where head_dim is a multiple of 16; the
 * score's dot product in two accumulators (head_dim 64 is 8 vectors: one chain of 8 dependent
 * multiply-adds otherwise). */
static int score_vectors(const float *q, int heads, const float *keys, const int64_t *slots,
                         int64_t count, int64_t kv_stride, int64_t head_dim, float scale,
                         float scores[MAX_GROUP][CHUNK]) {
    if (head_dim % 16) return 0;
    for (int64_t t = 0; t < count; t++) {
        const float *k = keys + slots[t] * kv_stride;
        for (int h = 0; h < heads; h++) {
            const float *query = q + h * head_dim;
            __m256 even = _mm256_mul_ps(_mm256_loadu_ps(query), _mm256_loadu_ps(k));
            __m256 odd = _mm256_mul_ps(_mm256_loadu_ps(query + 8), _mm256_loadu_ps(k + 8));
            for (int64_t d = 16; d < head_dim; d += 16) {
                even = _mm256_fmadd_ps(_mm256_loadu_ps(query + d), _mm256_loadu_ps(k + d), even);
                odd = _mm256_fmadd_ps(_mm256_loadu_ps(query + d + 8), _mm256_loadu_ps(k + d + 8),
                                      odd);
            }
            scores[h][t] = ladle_sum256(_mm256_add_ps(even, odd)) * scale;
        }
    }
    return 1;
}

static int sum_vectors(int heads, const float *values, const int64_t *slots, int64_t count,
                       int64_t kv_stride, int64_t head_dim, float weights[MAX_GROUP][CHUNK],
                       float acc[MAX_GROUP][MAX_HEAD_DIM]) {
    if (head_dim % 16) return 0;
    for (int64_t d = 0; d < head_dim; d += 8) {
        __m256 sums[MAX_GROUP];
        for (int h = 0; h < heads; h++) sums[h] = _mm256_loadu_ps(&acc[h][d]);
        for (int64_t t = 0; t < count; t++) {
            const __m256 v = _mm256_loadu_ps(values + slots[t] * kv_stride + d);
            for (int h = 0; h < heads; h++)
                sums[h] = _mm256_fmadd_ps(_mm256_set1_ps(weights[h][t]), v, sums[h]);
        }
        for (int h = 0; h < heads; h++) _mm256_storeu_ps(&acc[h][d], sums[h]);
    }
    return 1;
}
#else
static int score_vectors(const float *q, int heads, const float *keys, const int64_t *slots,
                         int64_t count, int64_t kv_stride, int64_t head_dim, float scale,
                         float scores[MAX_GROUP][CHUNK]) {
    (void)q, (void)heads, (void)keys, (void)slots, (void)count, (void)kv_stride;
    (void)head_dim, (void)scale, (void)scores;
    return 0;
}

static int sum_vectors(int heads, const float *values, const int64_t *slots, int64_t count,
                       int64_t kv_stride, int64_t head_dim, float weights[MAX_GROUP][CHUNK],
                       float acc[MAX_GROUP][MAX_HEAD_DIM]) {
    (void)heads, (void)values, (void)slots, (void)count, (void)kv_stride, (void)head_dim;
    (void)weights, (void)acc;
    return 0;
}
#endif

/* Query heads q[0..heads) (consecutive rows of head_dim) over one kv head's context:
 * per chunk of positions, every head's scores (each key read once for all heads), their
 * exponentials against the running maximum, then every head's weighted sum of the values (each
 * value read once). Why: one head and one position at a time was a chain of dependent steps
 * (score, maximum, rescale) per position, ~65 cycles each at batch 32, and read each key and
 * value once per query head of the group. */
static void attend_heads(const float *q, int heads, const float *keys, const float *values,
                         const int64_t *slots, int64_t length, int64_t kv_stride,
                         int64_t head_dim, float scale, float *out) {
    float acc[MAX_GROUP][MAX_HEAD_DIM];
    float scores[MAX_GROUP][CHUNK];
    float running_max[MAX_GROUP], denominator[MAX_GROUP];
    for (int h = 0; h < heads; h++) {
        for (int64_t d = 0; d < head_dim; d++) acc[h][d] = 0.0f;
        running_max[h] = -INFINITY;
        denominator[h] = 0.0f;
    }
    for (int64_t start = 0; start < length; start += CHUNK) {
        const int64_t count = length - start < CHUNK ? length - start : CHUNK;
        if (!score_vectors(q, heads, keys, slots + start, count, kv_stride, head_dim, scale,
                           scores)) {
            for (int64_t t = 0; t < count; t++) {
                const float *k = keys + slots[start + t] * kv_stride;
                for (int h = 0; h < heads; h++) {
                    const float *query = q + h * head_dim;
                    float score = 0.0f;
#pragma omp simd reduction(+ : score)
                    for (int64_t d = 0; d < head_dim; d++) score += query[d] * k[d];
                    scores[h][t] = score * scale;
                }
            }
        }
        for (int h = 0; h < heads; h++) {
            float chunk_max = running_max[h];
#pragma omp simd reduction(max : chunk_max)
            for (int64_t t = 0; t < count; t++) chunk_max = fmaxf(chunk_max, scores[h][t]);
            const float rescale = expf(running_max[h] - chunk_max); /* 0 on the first chunk */
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t t = 0; t < count; t++) {
                scores[h][t] = exp_nonpositive(scores[h][t] - chunk_max);
                sum += scores[h][t];
            }
            denominator[h] = denominator[h] * rescale + sum;
            running_max[h] = chunk_max;
            if (rescale != 1.0f) {
#pragma omp simd
                for (int64_t d = 0; d < head_dim; d++) acc[h][d] *= rescale;
            }
        }
        if (!sum_vectors(heads, values, slots + start, count, kv_stride, head_dim, scores, acc)) {
            for (int64_t t = 0; t < count; t++) {
                const float *v = values + slots[start + t] * kv_stride;
                for (int h = 0; h < heads; h++) {
                    const float weight = scores[h][t];
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; d++) acc[h][d] += weight * v[d];
                }
            }
        }
    }
    for (int h = 0; h < heads; h++) {
        const float inverse = denominator[h] > 0.0f ? 1.0f / denominator[h] : 0.0f;
        for (int64_t d = 0; d < head_dim; d++) out[h * head_dim + d] = acc[h][d] * inverse;
    }
}

typedef struct {
    const float *query, *keys, *values;
    const int64_t *slots, *lengths;
    int64_t num_heads, group, kv_stride, head_dim, max_context, groups_per_request;
    float scale;
    float *out;
} attention_job;

/* item: one request's query heads sharing one kv head, up to MAX_GROUP of them */
static void attend_item(const void *args, int64_t item) {
    const attention_job *job = args;
    const int64_t per_kv_head = (job->group + MAX_GROUP - 1) / MAX_GROUP;
    const int64_t request = item / job->groups_per_request;
    const int64_t within = item % job->groups_per_request;
    const int64_t kv_head = within / per_kv_head;
    const int64_t first = kv_head * job->group + (within % per_kv_head) * MAX_GROUP;
    const int64_t end = (kv_head + 1) * job->group;
    const int heads = (int)(end - first < MAX_GROUP ? end - first : MAX_GROUP);
    const int64_t row = request * job->num_heads + first;
    attend_heads(job->query + row * job->head_dim, heads, job->keys + kv_head * job->head_dim,
                 job->values + kv_head * job->head_dim, job->slots + request * job->max_context,
                 job->lengths[request], job->kv_stride, job->head_dim, job->scale,
                 job->out + row * job->head_dim);
}

/* Returns 0, or -1 when head_dim is past what this kernel holds in registers. Query rows and
 * heads are shared out by thread_pool.c. */
int ladle_decode_attention(const float *query, const float *keys, const float *values,
                           const int64_t *slots, const int64_t *lengths, int64_t num_requests,
                           int64_t max_context, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, double scale, float *out, int64_t num_threads) {
    if (head_dim > MAX_HEAD_DIM || num_kv_heads < 1 || num_heads % num_kv_heads) return -1;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t groups_per_request = num_kv_heads * ((group + MAX_GROUP - 1) / MAX_GROUP);
    attention_job job = {query, keys, values, slots, lengths, num_heads, group,
                         num_kv_heads * head_dim, head_dim, max_context, groups_per_request,
                         (float)scale, out};
    const int64_t work = num_requests * num_heads * max_context * head_dim;
    ladle_run_chunks(attend_item, &job, num_requests * groups_per_request,
                     work >= MIN_PARALLEL_WORK ? num_threads : 1);
    return 0;
}
