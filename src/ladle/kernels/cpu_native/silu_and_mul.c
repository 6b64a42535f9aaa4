/* SiLU-and-multiply, the gated activation of Llama-family MLPs, for the CPU's decode steps
 * (three torch ops and a chunk otherwise). float32. */
#include <math.h>
#include <stdint.h>

/* out[r][k] = silu(gate[r][k]) * up[r][k], gate and up the two halves of each row of gate_up. */
void ladle_silu_and_mul(const float *gate_up, float *out, int64_t num_rows, int64_t width) {
    for (int64_t row = 0; row < num_rows; row++) {
        const float *gate = gate_up + row * 2 * width, *up = gate + width;
        float *result = out + row * width;
        for (int64_t k = 0; k < width; k++) result[k] = gate[k] / (1.0f + expf(-gate[k])) * up[k];
    }
}
