/* e^x for x <= 0 in plain arithmetic the compiler vectorises (a call to expf per element keeps
 * a loop scalar: in decode attention's softmax it was ~40% of the kernel's time at batch 32):
 * x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact to float32), e^r by its
 * Taylor polynomial to r^7 / 7! (relative error < 2e-8 there, below float32's rounding), times
 * 2^n built in the exponent bits. Below -87 it returns e^-87 (~1.6e-38). */
#ifndef LADLE_FAST_EXP_H
#define LADLE_FAST_EXP_H
#include <stdint.h>

static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    /* round to nearest: adding 1.5 * 2^23 leaves the integer in the low mantissa bits */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t bits;
        float value;
    } two_to_n = {((int32_t)n + 127) << 23};
    return p * two_to_n.value;
}

#endif
