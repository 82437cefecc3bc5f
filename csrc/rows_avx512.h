// Internal to the AVX-512 row kernels: rows_avx512.cpp (the chunk loop of
// every block format, and the entry) and rows_avx512_grouped.cpp (MXFP4 and
// Q8_0 eight blocks per vector, and decode's split form): the target
// attribute and what the entry calls.
#pragma once
#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 intrinsics initialize their undefined vectors from
// themselves, which -W(maybe-)uninitialized reports once inlined into target-
// attribute functions (GCC bug 105593, fixed in 13): a false alarm.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef GOOSEDUMP_AVX512_EMULATED
#include <immintrin.h>
// (tests/test_avx512.py compiles this file with GOOSEDUMP_AVX512_EMULATED and
// SIMDe's portable AVX-512 in place of the instructions, on CPUs without
// them: the functions then take AVX2's target)
// (GD_VBMI: rows_avx512_vbmi.cpp, the grouped kernels' form with vpermb
// and vpermt2b; everything else runs on AVX-512 without VBMI too)
#ifdef GD_VBMI
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))
#else
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#endif
#else
#define AVX512 __attribute__((target("avx2,fma,f16c")))
#endif

// The grouped kernels' pieces (rows_avx512_groups.h), inlined whatever the
// unit's size: with four formats' kernels in one unit GCC had left
// mxfp4_values, group_sums and q8_codes out of line (MXFP4's one-token
// products then read 0.75x as fast).
#define AVX512_INLINE AVX512 inline __attribute__((always_inline))

#include <cstring>

#include "formats.h"
#include "matmul.h"
#include "quants.h"
#include "rows.h"
#include "rows_x86.h"

namespace gd {

// MXFP4's, Q8_0's, Q4_0's and Q5_0's rows [n0, n1) against T tokens (a: their grouped
// activations, ActView::grouped, or at decode's few tokens their split
// form): rows_avx512_i16's contract (rows.h). The form with VBMI's byte
// permutes where cpu_has_vbmi() (rows_avx512_vbmi.cpp), else the same
// bytes by qword and word permutes (rows_avx512_grouped.cpp): the same bits.
void rows_avx512_grouped(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                         float* Y, size_t ldy, const float* bias);
void rows_avx512_grouped_vbmi(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a,
                              size_t T, float* Y, size_t ldy, const float* bias);
void rows_avx512_grouped_bw(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                            float* Y, size_t ldy, const float* bias);

}  // namespace gd
#endif
