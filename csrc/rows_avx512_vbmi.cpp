// rows_avx512_grouped.cpp's kernels in their form for CPUs with AVX-512
// VBMI (Intel Ice Lake and later, AMD Zen 4 and later): each group's bytes
// gathered by vpermt2b and its values looked up by vpermb, a few operations
// a group fewer than the qword and word permutes that the file's own form
// (every AVX-512 CPU) takes instead; the same bits. rows_avx512_grouped
// (rows_avx512.cpp) picks the form by cpu_has_vbmi().
#define GD_VBMI 1
#include "rows_avx512_grouped.cpp"
