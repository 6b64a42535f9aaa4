/* The exported kernels that decode_stack.c chains inside one call (each defined in its own .c
 * file of this directory, where its contract is documented). */
#ifndef LADLE_DECODE_KERNELS_H
#define LADLE_DECODE_KERNELS_H
#include <stdint.h>

void ladle_add_rms_norm(const float *x, float *residual, const float *weight, double eps,
                        float *out, int64_t num_rows, int64_t hidden);

int ladle_q4_int8_gemm(const float *x, int64_t m, int64_t padded, int64_t activation_bits,
                       const uint8_t *codes, const void *scale, const void *offset,
                       int64_t scale_is_half, const float *bias, float *y, int64_t n,
                       int64_t num_threads);

int ladle_rotary_and_cache(float *qkv, int64_t num_tokens, int64_t row_stride,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           const float *cos, const float *signed_sin, float *key_cache,
                           float *value_cache, const int64_t *slots, int64_t num_slots);

int ladle_decode_attention(const float *query, const float *keys, const float *values,
                           const int64_t *slots, const int64_t *lengths, int64_t num_requests,
                           int64_t max_context, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, double scale, float *out, int64_t num_threads);

void ladle_silu_and_mul(const float *gate_up, float *out, int64_t num_rows, int64_t width);

#endif
