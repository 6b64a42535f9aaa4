/* Which vector path the kernels take, decided once from the build's target (-march):
 *
 *   LADLE_AVX512       AVX-512 F and BW: 16 floats or 64 bytes to a vector
 *   LADLE_AVX512_VNNI  and VNNI's vpdpbusd (q4_int8_gemm.c's interleaved batched path)
 *   LADLE_AVX2         otherwise AVX2 with FMA: 8 floats or 32 bytes to a vector
 *   LADLE_VNNI256      and a 256-bit vpdpbusd: AVX-VNNI's VEX form (Intel client CPUs without
 *                      AVX-512), or the EVEX form of the same instruction where the target has
 *                      AVX-512 VNNI and VL but not BW (how a machine with AVX-512 runs and
 *                      tests this path: -march=x86-64-v3 -mavx512vl -mavx512vnni)
 *   none of them       plain C (which the compiler vectorises where it can)
 */
#ifndef LADLE_SIMD_LEVEL_H
#define LADLE_SIMD_LEVEL_H

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LADLE_AVX512 1
#if defined(__AVX512VNNI__)
#define LADLE_AVX512_VNNI 1
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#define LADLE_AVX2 1
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define LADLE_VNNI256 1
#endif
#endif

#if defined(LADLE_AVX512) || defined(LADLE_AVX2) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(LADLE_VNNI256)
/* acc + the 4-byte dot products of unsigned a and signed b, in 8 int32 lanes */
#if defined(__AVXVNNI__)
#define ladle_dpbusd256(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#else
#define ladle_dpbusd256(acc, a, b) _mm256_dpbusd_epi32(acc, a, b)
#endif
#endif

#endif
