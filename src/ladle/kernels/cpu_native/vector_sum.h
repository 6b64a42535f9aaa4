/* Horizontal sums of 256-bit vectors, for the kernels' AVX2 paths. */
#ifndef LADLE_VECTOR_SUM_H
#define LADLE_VECTOR_SUM_H

#if defined(__AVX2__)
#include <immintrin.h>

static inline float ladle_sum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
