/* SiLU-and-multiply, the gated activation of Llama-family MLPs, for the CPU's decode steps
 * (three torch ops and a chunk otherwise). float32. */
#include <math.h>
#include <stdint.h>

#include "fast_exp.h"

/* out[r][k] = silu(gate[r][k]) * up[r][k], gate and up the two halves of each row of gate_up.
 * sigmoid(g) from e = e^-|g| <= 1 (exp_nonpositive, vectorised): 1 / (1 + e) for g >= 0, and
 * e / (1 + e) below, so no exponential overflows. */
void ladle_silu_and_mul(const float *gate_up, float *out, int64_t num_rows, int64_t width) {
    for (int64_t row = 0; row < num_rows; row++) {
        const float *gate = gate_up + row * 2 * width, *up = gate + width;
        float *result = out + row * width;
#pragma omp simd
        for (int64_t k = 0; k < width; k++) {
            const float g = gate[k], e = exp_nonpositive(-fabsf(g));
            const float sigmoid = (g >= 0.0f ? 1.0f : e) / (1.0f + e);
            result[k] = g * sigmoid * up[k];
        }
    }
}
