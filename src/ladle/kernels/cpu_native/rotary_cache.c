/* Rotary on the query and key heads of the merged qkv projection, in place, and the step's keys
 * and values written into the paged cache: one call per layer for what is ten torch ops (the
 * rotation's chunk, cat, two multiplies and an add; two index_copy_ writes; their views).
 *
 *     qkv     [num_tokens, row_stride] float32: query heads, key heads, value heads side by side
 *     cos, signed_sin [num_tokens, head_dim]: RotaryEmbedding.step_tables (cos of each half
 *             repeated; (-sin, sin))
 *     key_cache, value_cache: the cache halves, flat [slots, num_kv_heads, head_dim]
 *     slots   [num_tokens] int64: each token's cache slot, < num_slots (else nothing is done)
 *
 * x[i] * cos[i] + x[i +- head_dim / 2] * signed_sin[i], rounded as torch rounds it (two
 * products, then the sum: compiled as ISO C, so no fused multiply-add).
 */
#include <stdint.h>
#include <string.h>

#define MAX_HEAD_DIM 256

int ladle_rotary_and_cache(float *qkv, int64_t num_tokens, int64_t row_stride,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           const float *cos, const float *signed_sin, float *key_cache,
                           float *value_cache, const int64_t *slots, int64_t num_slots) {
    if (head_dim > MAX_HEAD_DIM || head_dim % 2) return -1;
    for (int64_t t = 0; t < num_tokens; t++)
        if (slots[t] < 0 || slots[t] >= num_slots) return -1;
    const int64_t half = head_dim / 2, kv_width = num_kv_heads * head_dim;
    float original[MAX_HEAD_DIM];
    for (int64_t t = 0; t < num_tokens; t++) {
        float *row = qkv + t * row_stride;
        const float *c = cos + t * head_dim, *s = signed_sin + t * head_dim;
        for (int64_t h = 0; h < num_heads + num_kv_heads; h++) {
            float *x = row + h * head_dim;
            memcpy(original, x, (size_t)head_dim * sizeof(float));
            for (int64_t i = 0; i < half; i++) {
                float product = original[i] * c[i], partner = original[i + half] * s[i];
                x[i] = product + partner;
            }
            for (int64_t i = half; i < head_dim; i++) {
                float product = original[i] * c[i], partner = original[i - half] * s[i];
                x[i] = product + partner;
            }
        }
        memcpy(key_cache + slots[t] * kv_width, row + num_heads * head_dim,
               (size_t)kv_width * sizeof(float));
        memcpy(value_cache + slots[t] * kv_width, row + (num_heads + num_kv_heads) * head_dim,
               (size_t)kv_width * sizeof(float));
    }
    return 0;
}
