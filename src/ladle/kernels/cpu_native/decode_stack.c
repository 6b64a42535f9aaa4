/* A whole decode step's decoder stack in one call, for the CPU: every layer of a Llama-family
 * model whose four projections are 4-bit weights in groups of 32 (GGUF Q4_0/Q4_1/Q4_K kept in
 * their format), for decode rows only (one new token per request), then the final norm.
 *
 * Per layer, on m rows of hidden size H:
 *
 *     normed = RMSNorm(residual += x)               (layer 0: residual = the embeddings)
 *     qkv = normed @ Wqkv^T (+ b); rotary on q, k; k, v -> the paged cache at slot_mapping
 *     x = attention(q over the cache) @ Wo^T (+ b)
 *     normed = RMSNorm(residual += x)
 *     x = silu_and_mul(normed @ Wgate_up^T) @ Wdown^T
 *
 * and out = RMSNorm(residual + x) after the last layer. Each step is the same exported kernel
 * that the layer-by-layer path calls through torch (decode_kernels.h), on the same operands,
 * so the result is that path's, bit for bit.
 *
 * Why: at batch 1 the default model's step is 30 layers x ~25 torch ops and ctypes calls of a
 * few microseconds each around kernels of tens of microseconds; measured, the 120 4-bit
 * matmuls took ~15 ms a step through torch against ~10 ms for the kernels alone, and the
 * Python of the layers ~4 ms more (docs/benchmarks.md, t12b1). Here the only Python left is
 * one call per step.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_kernels.h"

#define MAX_HEAD_DIM 256 /* decode_attention.c and rotary_cache.c hold a head on the stack */
#define MAX_GROUPS 1024  /* q4_int8_gemm.c's limit on groups of 32 per row */

/* One projection: 4-bit codes [n, K / 2], group scales and offsets [n, K / 32] (float16 or
 * float32; offset NULL when symmetric), an optional float32 bias [n]. */
typedef struct {
    const uint8_t *codes;
    const void *scale, *offset;
    const float *bias;
    int64_t scale_is_half;
} q4_weight;

/* One decoder layer's weights; every field is 8 bytes, so Python fills an int64 array
 * [num_layers, ladle_decode_stack_layer_fields()] of pointers and flags. */
typedef struct {
    const float *input_norm, *post_attention_norm; /* float32 [H] */
    q4_weight qkv, o, gate_up, down;
    float *kv_cache; /* [2, num_slots, num_kv_heads, head_dim]: keys, then values */
} layer_weights;

_Static_assert(sizeof(layer_weights) == 23 * sizeof(int64_t), "layer fields are 8 bytes");

int64_t ladle_decode_stack_layer_fields(void) { return sizeof(layer_weights) / sizeof(int64_t); }

/* The model's sizes and this step's, in this order (Python's DecodeStackDims). */
typedef struct {
    int64_t num_layers, num_rows, hidden, num_heads, num_kv_heads, head_dim, intermediate;
    int64_t activation_bits, num_slots, max_context;
} stack_dims;

static int projection(const q4_weight *w, const float *x, int64_t m, int64_t k, int64_t n,
                      int64_t bits, float *y, int64_t threads) {
    return ladle_q4_int8_gemm(x, m, k, bits, w->codes, w->scale, w->offset, w->scale_is_half,
                              w->bias, y, n, threads);
}

/* Returns 0; -1 for sizes outside what the chained kernels take (checked before anything is
 * written); -2 when out of memory or a kernel refused (the cache may then hold some of this
 * step's keys and values: the caller's layer-by-layer path rewrites the same values). */
int ladle_decode_stack(const layer_weights *layers, const stack_dims *dims, double eps,
                       double attention_scale, const float *final_norm, const float *embedded,
                       const float *cos, const float *signed_sin, const int64_t *slot_mapping,
                       const int64_t *context_slots, const int64_t *lengths, float *out,
                       int64_t num_threads) {
    const int64_t m = dims->num_rows, hidden = dims->hidden, head_dim = dims->head_dim;
    const int64_t num_heads = dims->num_heads, num_kv_heads = dims->num_kv_heads;
    const int64_t intermediate = dims->intermediate, bits = dims->activation_bits;
    const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    if (m < 1 || dims->num_layers < 1 || head_dim > MAX_HEAD_DIM || head_dim % 2) return -1;
    if (num_kv_heads < 1 || num_heads % num_kv_heads || (bits != 8 && bits != 16)) return -1;
    /* every projection's K: whole pairs of groups of 32, as q4_int8_gemm.c reads them */
    const int64_t widths[3] = {hidden, q_size, intermediate};
    for (int i = 0; i < 3; i++)
        if (widths[i] % 64 || widths[i] / 32 > MAX_GROUPS) return -1;
    for (int64_t t = 0; t < m; t++)
        if (slot_mapping[t] < 0 || slot_mapping[t] >= dims->num_slots) return -1;

    const int64_t floats = 3 * m * hidden + m * qkv_size + 2 * m * q_size +
                           m * 2 * intermediate + m * intermediate;
    float *scratch = malloc((size_t)floats * sizeof(float));
    if (!scratch) return -2;
    float *residual = scratch, *normed = residual + m * hidden, *x = normed + m * hidden;
    float *qkv = x + m * hidden, *query = qkv + m * qkv_size, *attended = query + m * q_size;
    float *gate_up = attended + m * q_size, *activated = gate_up + m * 2 * intermediate;

    int status = 0;
    memcpy(residual, embedded, (size_t)(m * hidden) * sizeof(float));
    for (int64_t l = 0; l < dims->num_layers && status == 0; l++) {
        const layer_weights *layer = &layers[l];
        float *keys = layer->kv_cache, *values = keys + dims->num_slots * kv_size;
        ladle_add_rms_norm(l == 0 ? 0 : x, residual, layer->input_norm, eps, normed, m, hidden);
        status |= projection(&layer->qkv, normed, m, hidden, qkv_size, bits, qkv, num_threads);
        if (status) break;
        status |= ladle_rotary_and_cache(qkv, m, qkv_size, num_heads, num_kv_heads, head_dim,
                                         cos, signed_sin, keys, values, slot_mapping,
                                         dims->num_slots);
        /* the query heads of each row, contiguous (the layer path's query.contiguous()) */
        for (int64_t t = 0; t < m; t++)
            memcpy(query + t * q_size, qkv + t * qkv_size, (size_t)q_size * sizeof(float));
        status |= ladle_decode_attention(query, keys, values, context_slots, lengths, m,
                                         dims->max_context, num_heads, num_kv_heads, head_dim,
                                         attention_scale, attended, num_threads);
        status |= projection(&layer->o, attended, m, q_size, hidden, bits, x, num_threads);
        if (status) break;
        ladle_add_rms_norm(x, residual, layer->post_attention_norm, eps, normed, m, hidden);
        status |= projection(&layer->gate_up, normed, m, hidden, 2 * intermediate, bits,
                             gate_up, num_threads);
        if (status) break;
        ladle_silu_and_mul(gate_up, activated, m, intermediate);
        status |= projection(&layer->down, activated, m, intermediate, hidden, bits, x,
                             num_threads);
    }
    if (status == 0) ladle_add_rms_norm(x, residual, final_norm, eps, out, m, hidden);
    free(scratch);
    return status == 0 ? 0 : -2;
}
