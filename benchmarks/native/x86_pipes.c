/* How many of each AVX2 instruction the one-token MXFP4 kernel uses a core
   issues per cycle, alone and in pairs, and the kernel's whole mix of one
   block (ten vector operations and four loads) issued without its
   dependences: the floor a block's chain of dependences is measured against
   (docs/performance.md, the Zen 3 section; mxfp4_cycles.cpp times the kernel
   itself), in both of its forms (the 256-bit one, and the 128-bit one for
   cores that split 256-bit operations, a pair of blocks at a time as it
   runs). The same for a full tile's token and block (mxfp4_pair<8>: the
   codes are made once for eight tokens, so a token's share is the products,
   the conversion and the scale), with and without the scale's multiplies
   (docs/performance.md, the Zen 1 section; mxfp4_tiles.cpp times the
   tiles). Last, the 4-lane tile of the cores that split 256-bit operations
   (row_mxfp4_h<8>) WITH its dependences, alone and finished five ways: what its
   conversion and its scale's FMA cost beside the products' floor. And
   whether fp32 FMAs issue beside vpmaddwd or share its pipes.
   x86-64 with AVX2; cycles from core_clock.h, so the figures hold
   at whatever clock the core runs.

     gcc -O2 benchmarks/native/x86_pipes.c -o x86_pipes && ./x86_pipes */
#include <stdio.h>
#include <stdlib.h>

#include "core_clock.h"

static char* buf;
static double hz;

#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm11", "xmm12", "xmm13", "memory"
#define LOOPS 20000000L
/* cycles per run of an asm body: the best of three runs of LOOPS */
#define CYCLES(var, body)                                                             \
  do {                                                                                \
    double best = 1e30;                                                               \
    for (int r = 0; r < 3; ++r) {                                                     \
      const double t = now_seconds();                                                 \
      for (long i = 0; i < LOOPS; ++i) __asm__ volatile(body ::"r"(buf) : CLOBBER); \
      const double s = now_seconds() - t;                                             \
      if (s < best) best = s;                                                         \
    }                                                                                 \
    var = best * hz / LOOPS;                                                          \
  } while (0)
/* each asm body holds `per` of what is counted: printed per cycle */
#define RUN(name, per, body)                                \
  do {                                                      \
    double cycles;                                          \
    CYCLES(cycles, body);                                   \
    printf("  %-44s %5.2f\n", name, (double)(per) / cycles); \
  } while (0)

/* independent instructions: sources ymm8, ymm9; each writes its own register */
#define M(d) "vpmaddwd %%ymm8, %%ymm9, %%ymm" #d "\n\t"
#define C(d) "vcvtdq2ps %%ymm8, %%ymm" #d "\n\t"
#define S(d) "vpshufb %%ymm8, %%ymm9, %%ymm" #d "\n\t"
#define V(d) "vpsrlvq %%ymm8, %%ymm9, %%ymm" #d "\n\t"
#define L(d) "vpsllw $8, %%ymm8, %%ymm" #d "\n\t"
#define F(d) "vmulps %%ymm8, %%ymm9, %%ymm" #d "\n\t"
#define A(d) "vaddps %%ymm8, %%ymm9, %%ymm" #d "\n\t"
#define I(d) "vpaddd %%ymm8, %%ymm9, %%ymm" #d "\n\t"
#define FM(d) "vfmadd231ps %%ymm8, %%ymm9, %%ymm" #d "\n\t"
#define LD(d, off) "vmovdqa " #off "(%0), %%ymm" #d "\n\t"
#define BC(d, off) "vbroadcastss " #off "(%0), %%ymm" #d "\n\t"
#define EIGHT(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define MIX(X, Y) X(0) Y(1) X(2) Y(3) X(4) Y(5) X(6) Y(7)

/* one block of row_mxfp4<1> (rows_avx2_i16.cpp): the codes' shift, and,
   table shuffle, shift, and; two multiply-adds, their add, the conversion;
   a multiply or fused multiply-add (one of each per pair of blocks); with
   its loads: the 16 code bytes, the two activation halves, the scale */
#define BLOCK(a, b)                                                                                  \
  "vbroadcasti128 1(%0), %%ymm" #a "\n\t" "vpsrlvq %%ymm8, %%ymm9, %%ymm" #a "\n\t"                  \
  "vpand %%ymm8, %%ymm9, %%ymm" #b "\n\t" "vpshufb %%ymm8, %%ymm9, %%ymm" #a "\n\t"                  \
  "vpsllw $8, %%ymm8, %%ymm" #b "\n\t" "vpand %%ymm8, %%ymm9, %%ymm" #a "\n\t"                      \
  "vpmaddwd 64(%0), %%ymm9, %%ymm" #b "\n\t" "vpmaddwd 96(%0), %%ymm9, %%ymm" #a "\n\t"              \
  "vpaddd %%ymm8, %%ymm9, %%ymm" #b "\n\t" "vcvtdq2ps %%ymm8, %%ymm" #a "\n\t"                      \
  "vbroadcastss 128(%0), %%ymm" #b "\n\t" "vmulps %%ymm8, %%ymm9, %%ymm" #b "\n\t"

/* a pair of blocks of row_mxfp4_x128 (the one-token form for cores that
   split 256-bit operations until the twenty-third session, whose rows,
   csrc/rows_avx2_halves.h, add a block's two halves before one conversion
   and one FMA), in 128-bit registers: each block's codes
   (load, and, shift, and, two table shuffles, two shifts and two ands for
   the even and odd codes), its sums (four multiply-adds with their
   activations from memory, two adds, two conversions), then the pair's
   scales into the lanes' two accumulators (xmm11, xmm12: the only
   dependences from pair to pair, as in the kernel) */
#define X128_CODES(off, a, b, c, d)                                                                      \
  "vmovdqu " #off "(%0), %%xmm0\n\t" "vpand %%xmm8, %%xmm0, %%xmm" #a "\n\t"                             \
  "vpsrlw $4, %%xmm0, %%xmm" #b "\n\t" "vpand %%xmm8, %%xmm" #b ", %%xmm" #b "\n\t"                      \
  "vpshufb %%xmm" #a ", %%xmm9, %%xmm" #a "\n\t" "vpshufb %%xmm" #b ", %%xmm9, %%xmm" #b "\n\t"           \
  "vpsllw $8, %%xmm" #a ", %%xmm" #c "\n\t" "vpand %%xmm10, %%xmm" #a ", %%xmm" #a "\n\t"                \
  "vpsllw $8, %%xmm" #b ", %%xmm" #d "\n\t" "vpand %%xmm10, %%xmm" #b ", %%xmm" #b "\n\t"
#define X128_SUMS(off, a, b, c, d)                                                                       \
  "vpmaddwd " #off "+64(%0), %%xmm" #c ", %%xmm" #c "\n\t" "vpmaddwd " #off "+80(%0), %%xmm" #a ", %%xmm" #a "\n\t" \
  "vpmaddwd " #off "+96(%0), %%xmm" #d ", %%xmm" #d "\n\t" "vpmaddwd " #off "+112(%0), %%xmm" #b ", %%xmm" #b "\n\t" \
  "vpaddd %%xmm" #c ", %%xmm" #a ", %%xmm" #a "\n\t" "vpaddd %%xmm" #d ", %%xmm" #b ", %%xmm" #b "\n\t"   \
  "vcvtdq2ps %%xmm" #a ", %%xmm" #a "\n\t" "vcvtdq2ps %%xmm" #b ", %%xmm" #b "\n\t"
#define X128_PAIR(off)                                                                                   \
  X128_CODES(off, 1, 2, 3, 4) X128_CODES(off + 16, 5, 6, 7, 13)                                          \
  X128_SUMS(off, 1, 2, 3, 4) X128_SUMS(off + 128, 5, 6, 7, 13)                                           \
  "vbroadcastss " #off "+200(%0), %%xmm3\n\t" "vbroadcastss " #off "+204(%0), %%xmm4\n\t"                 \
  "vmulps %%xmm3, %%xmm1, %%xmm1\n\t" "vfmadd231ps %%xmm4, %%xmm5, %%xmm1\n\t" "vaddps %%xmm1, %%xmm11, %%xmm11\n\t" \
  "vmulps %%xmm3, %%xmm2, %%xmm2\n\t" "vfmadd231ps %%xmm4, %%xmm6, %%xmm2\n\t" "vaddps %%xmm2, %%xmm12, %%xmm12\n\t"

/* one token's step of mxfp4_pair<8> (rows_avx2_i16.cpp), the codes in
   ymm8, ymm9: per block two multiply-adds with their activations from
   memory, their add, the conversion; the blocks' scales broadcast from
   memory, a multiply, a fused multiply-add and the add into the token's
   accumulator (SCALED 0: the two sums added instead, a floor for any
   scaling). Two blocks: 8 loads of 128 bits, 22 operations of 128 bits. */
#define TOKEN_PAIR(off, SCALED)                                                                          \
  "vpmaddwd " #off "(%0), %%ymm8, %%ymm0\n\t" "vpmaddwd " #off "+32(%0), %%ymm9, %%ymm1\n\t"            \
  "vpaddd %%ymm0, %%ymm1, %%ymm0\n\t" "vcvtdq2ps %%ymm0, %%ymm0\n\t"                                       \
  "vpmaddwd " #off "+64(%0), %%ymm8, %%ymm2\n\t" "vpmaddwd " #off "+96(%0), %%ymm9, %%ymm3\n\t"         \
  "vpaddd %%ymm2, %%ymm3, %%ymm2\n\t" "vcvtdq2ps %%ymm2, %%ymm2\n\t"                                       \
  SCALED                                                                                                 \
  "vaddps %%ymm0, %%ymm7, %%ymm7\n\t"
#define WITH_SCALES(off)                                                                                 \
  "vbroadcastss " #off "+128(%0), %%ymm4\n\t" "vbroadcastss " #off "+132(%0), %%ymm5\n\t"                 \
  "vmulps %%ymm4, %%ymm0, %%ymm0\n\t" "vfmadd231ps %%ymm5, %%ymm2, %%ymm0\n\t"
#define NO_SCALES "vaddps %%ymm2, %%ymm0, %%ymm0\n\t"

/* one token's step of row_mxfp4_h<8> (csrc/rows_avx2_halves.h: the tile
   in 128-bit registers, 4 lanes), the codes in xmm8..11, WITH its
   dependences, as the kernel chains them: four multiply-adds with their
   activations from memory, each added into the first; then FINISH, into
   the token's accumulator (xmm0..7, one per token: eight chains). Apart,
   the products and adds issue at the one multiply pipe's 4 cycles; what
   each finish adds to that is the price of the conversion and the scale. */
#define H_SUMS(off)                                                                                      \
  "vpmaddwd " #off "(%0), %%xmm8, %%xmm12\n\t" "vpmaddwd " #off "+16(%0), %%xmm9, %%xmm13\n\t"          \
  "vpaddd %%xmm12, %%xmm13, %%xmm12\n\t" "vpmaddwd " #off "+32(%0), %%xmm10, %%xmm13\n\t"               \
  "vpaddd %%xmm12, %%xmm13, %%xmm12\n\t" "vpmaddwd " #off "+48(%0), %%xmm11, %%xmm13\n\t"               \
  "vpaddd %%xmm12, %%xmm13, %%xmm12\n\t"
#define H_NONE(t)
#define H_CVT(t) "vcvtdq2ps %%xmm12, %%xmm12\n\t"
#define H_FMA(t) "vfmadd231ps 2048(%0), %%xmm12, %%xmm" #t "\n\t"
#define H_KERNEL(t) H_CVT(t) H_FMA(t)
#define H_CVT_ADD(t) H_CVT(t) "vaddps %%xmm12, %%xmm" #t ", %%xmm" #t "\n\t"
#define H_MAGIC_FMA(t) "vpaddd 2112(%0), %%xmm12, %%xmm12\n\t" "vsubps 2176(%0), %%xmm12, %%xmm12\n\t" H_FMA(t)
#define H_TILE(F)                                                                                        \
  H_SUMS(0) F(0) H_SUMS(64) F(1) H_SUMS(128) F(2) H_SUMS(192) F(3) H_SUMS(256) F(4) H_SUMS(320) F(5)   \
  H_SUMS(384) F(6) H_SUMS(448) F(7)
#define H_CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm12", "xmm13", "memory"
#define H_RUN(name, F)                                                                               \
  do {                                                                                               \
    double best = 1e30;                                                                              \
    for (int r = 0; r < 3; ++r) {                                                                    \
      const double t = now_seconds();                                                                \
      for (long i = 0; i < LOOPS / 4; ++i) __asm__ volatile(H_TILE(F) H_TILE(F) ::"r"(buf) : H_CLOBBER); \
      const double s = now_seconds() - t;                                                            \
      if (s < best) best = s;                                                                        \
    }                                                                                                \
    printf("  %-44s %5.2f\n", name, best * hz / (LOOPS / 4) / 16);                                  \
  } while (0)

int main(void) {
  buf = aligned_alloc(64, 4096);
  for (int i = 0; i < 4096; ++i) buf[i] = 1;
  hz = core_hz();
  printf("core clock %.2f GHz (dependent adds)\ninstructions per cycle, independent:\n", hz / 1e9);
  __asm__ volatile("vpxor %%ymm8, %%ymm8, %%ymm8\n\tvpxor %%ymm9, %%ymm9, %%ymm9\n\tvpxor %%ymm10, %%ymm10, %%ymm10" ::: "xmm8",
                   "xmm9", "xmm10");
  RUN("vpmaddwd", 8, EIGHT(M));
  RUN("vpshufb", 8, EIGHT(S));
  RUN("vpsrlvq", 8, EIGHT(V));
  RUN("vpsllw", 8, EIGHT(L));
  RUN("vcvtdq2ps", 8, EIGHT(C));
  RUN("vmulps", 8, EIGHT(F));
  RUN("vaddps", 8, EIGHT(A));
  RUN("vpaddd", 8, EIGHT(I));
  RUN("vpmaddwd + vmulps", 8, MIX(M, F));
  RUN("vpmaddwd + vcvtdq2ps", 8, MIX(M, C));
  RUN("vpmaddwd + vpshufb", 8, MIX(M, S));
  RUN("vcvtdq2ps + vaddps", 8, MIX(C, A));
  RUN("vcvtdq2ps + vmulps", 8, MIX(C, F));
  RUN("vpshufb + vpsllw", 8, MIX(S, L));
  RUN("vcvtdq2ps + vfmadd231ps", 8, MIX(C, FM));
  /* fp32 FMAs beside the multiply-adds, eight chains of one FMA a body (2 a
     cycle where the FMAs have pipes of their own, 4 where they share them):
     whether a prefill could add FMAs on integer-valued floats (exact below
     2^24) to the int16 products' rate */
  RUN("vpmaddwd + vfmadd231ps (8 chains)", 16,
      M(11) FM(0) M(12) FM(1) M(13) FM(2) M(11) FM(3) M(12) FM(4) M(13) FM(5) M(11) FM(6) M(12) FM(7));
  RUN("256-bit loads", 8, LD(0, 0) LD(1, 32) LD(2, 64) LD(3, 96) LD(4, 128) LD(5, 160) LD(6, 192) LD(7, 224));
  RUN("256-bit loads + broadcasts", 8, LD(0, 0) LD(1, 32) BC(2, 64) LD(3, 96) LD(4, 128) BC(5, 160) LD(6, 192) BC(7, 224));
  printf("one-token MXFP4, a block's operations and loads without their dependences:\n");
  double cycles;
  CYCLES(cycles, BLOCK(0, 1) BLOCK(2, 3) BLOCK(4, 5) BLOCK(6, 7));
  printf("  %-44s %5.2f\n", "cycles per block", cycles / 4);
  CYCLES(cycles, X128_PAIR(0) X128_PAIR(256) X128_PAIR(512) X128_PAIR(768));
  printf("  %-44s %5.2f\n", "the same in 128-bit halves, a pair at a time", cycles / 8);
  printf("a full tile's token and block (mxfp4_pair<8>), its operations and loads without their dependences:\n");
  CYCLES(cycles, TOKEN_PAIR(0, WITH_SCALES(0)) TOKEN_PAIR(256, WITH_SCALES(256)) TOKEN_PAIR(512, WITH_SCALES(512))
                     TOKEN_PAIR(768, WITH_SCALES(768)));
  printf("  %-44s %5.2f\n", "cycles per token and block", cycles / 8);
  CYCLES(cycles, TOKEN_PAIR(0, NO_SCALES) TOKEN_PAIR(256, NO_SCALES) TOKEN_PAIR(512, NO_SCALES) TOKEN_PAIR(768, NO_SCALES));
  printf("  %-44s %5.2f\n", "the same without the scales' multiplies", cycles / 8);
  printf("the tile in 128-bit registers (row_mxfp4_h<8>), a token and block with its dependences, cycles:\n");
  __asm__ volatile("vpxor %%xmm11, %%xmm11, %%xmm11" ::: "xmm11");
  H_RUN("products and adds", H_NONE);
  H_RUN("+ the conversion", H_CVT);
  H_RUN("+ the scale's FMA (no conversion)", H_FMA);
  H_RUN("+ both: the kernel's", H_KERNEL);
  H_RUN("+ the conversion and an add (no scale)", H_CVT_ADD);
  H_RUN("+ a magic number's add and subtract, the FMA", H_MAGIC_FMA);
  free(buf);
  return 0;
}
