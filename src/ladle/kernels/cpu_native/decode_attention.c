/* Decode attention on the CPU: one query row per request over its cached keys and values,
 * read in place from the paged cache through a flat slot list (no gathered copy), softmax in
 * one pass (a running maximum rescales the running sums), float32.
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

#include "thread_pool.h"

#define MAX_HEAD_DIM 256
#define MIN_PARALLEL_WORK (1 << 16)

static void attend_head(const float *q, const float *keys, const float *values,
                        const int64_t *slots, int64_t length, int64_t kv_stride,
                        int64_t head_dim, float scale, float *out) {
    float acc[MAX_HEAD_DIM];
    for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
    float running_max = -INFINITY, denominator = 0.0f;
    for (int64_t t = 0; t < length; t++) {
        const float *k = keys + slots[t] * kv_stride;
        float score = 0.0f;
#pragma omp simd reduction(+ : score)
        for (int64_t d = 0; d < head_dim; d++) score += q[d] * k[d];
        score *= scale;
        const float *v = values + slots[t] * kv_stride;
        if (score > running_max) {
            float rescale = expf(running_max - score);  /* 0 on the first position */
            denominator = denominator * rescale + 1.0f;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++) acc[d] = acc[d] * rescale + v[d];
            running_max = score;
        } else {
            float weight = expf(score - running_max);
            denominator += weight;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++) acc[d] += weight * v[d];
        }
    }
    float inverse = denominator > 0.0f ? 1.0f / denominator : 0.0f;
    for (int64_t d = 0; d < head_dim; d++) out[d] = acc[d] * inverse;
}

typedef struct {
    const float *query, *keys, *values;
    const int64_t *slots, *lengths;
    int64_t num_heads, group, kv_stride, head_dim, max_context;
    float scale;
    float *out;
} attention_job;

static void attend_item(const void *args, int64_t item) {
    const attention_job *job = args;
    int64_t request = item / job->num_heads, head = item % job->num_heads;
    int64_t kv_head = head / job->group;
    attend_head(job->query + item * job->head_dim, job->keys + kv_head * job->head_dim,
                job->values + kv_head * job->head_dim, job->slots + request * job->max_context,
                job->lengths[request], job->kv_stride, job->head_dim, job->scale,
                job->out + item * job->head_dim);
}

/* Returns 0, or -1 when head_dim is past what this kernel holds in registers. Query rows and
 * heads are shared out by thread_pool.c. */
int ladle_decode_attention(const float *query, const float *keys, const float *values,
                           const int64_t *slots, const int64_t *lengths, int64_t num_requests,
                           int64_t max_context, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, double scale, float *out, int64_t num_threads) {
    if (head_dim > MAX_HEAD_DIM || num_kv_heads < 1 || num_heads % num_kv_heads) return -1;
    attention_job job = {query, keys, values, slots, lengths, num_heads,
                         num_heads / num_kv_heads, num_kv_heads * head_dim, head_dim,
                         max_context, (float)scale, out};
    const int64_t work = num_requests * num_heads * max_context * head_dim;
    ladle_run_chunks(attend_item, &job, num_requests * num_heads,
                     work >= MIN_PARALLEL_WORK ? num_threads : 1);
    return 0;
}
