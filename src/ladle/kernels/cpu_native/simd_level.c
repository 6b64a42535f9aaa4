/* The vector path this build of the kernels takes (simd_level.h), for logs and tests. */
#include "simd_level.h"

const char *ladle_cpu_kernels_path(void) {
#if defined(LADLE_AVX512_VNNI)
    return "avx512-vnni";
#elif defined(LADLE_AVX512)
    return "avx512";
#elif defined(LADLE_VNNI256)
    return "avx2-vnni";
#elif defined(LADLE_AVX2)
    return "avx2";
#else
    return "plain-c";
#endif
}
