/* float16 -> float32 for the C kernels: F16C where the build has it, else by hand for the normal,
 * subnormal and zero values GGUF scales hold (no infinities or NaNs there). */
#ifndef LADLE_HALF_FLOAT_H
#define LADLE_HALF_FLOAT_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float ladle_half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F;
    uint32_t mantissa = h & 0x3FF, bits;
    if (exponent == 0 && mantissa == 0) bits = sign;
    else if (exponent == 0) {
        float value = (float)mantissa / 16777216.0f;
        return sign ? -value : value;
    } else bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    float result;
    memcpy(&result, &bits, 4);
    return result;
#endif
}

#endif
