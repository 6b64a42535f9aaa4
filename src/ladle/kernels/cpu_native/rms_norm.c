/* RMSNorm with the decoder layer's residual add, for the CPU's decode steps:
 *
 *     residual += x            (when x is given; the sum is written into residual in place)
 *     out = residual / sqrt(mean(residual^2) + eps) * weight
 *
 * float32 throughout, one row at a time. The torch version is five to eight ops per call and a
 * decode step has 61 norms; here a call costs about as much as one small torch op.
 */
#include <math.h>
#include <stdint.h>

void ladle_add_rms_norm(const float *x, float *residual, const float *weight, double eps,
                        float *out, int64_t num_rows, int64_t hidden) {
    for (int64_t row = 0; row < num_rows; row++) {
        float *values = residual + row * hidden;
        if (x) {
            const float *added = x + row * hidden;
#pragma omp simd
            for (int64_t k = 0; k < hidden; k++) values[k] += added[k];
        }
        float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
        for (int64_t k = 0; k < hidden; k++) sum_squares += values[k] * values[k];
        float inverse = 1.0f / sqrtf(sum_squares / (float)hidden + (float)eps);
        float *normed = out + row * hidden;
#pragma omp simd
        for (int64_t k = 0; k < hidden; k++) normed[k] = values[k] * inverse * weight[k];
    }
}
