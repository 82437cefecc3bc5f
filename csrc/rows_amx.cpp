// The AVX-512 path's grouped formats' products of many tokens (prefill's
// experts and attention projections) on Intel AMX's tiles (amx.h), with the
// same bits as rows_grouped's.
//
// A block's sum of 32 products is an integer: codes (twice the E2M1 values,
// -12..12) times int16 activations, |sum| < 2^24. AMX multiplies bf16 pairs
// into fp32 sums, which hold it exactly when each factor has at most 8
// significant bits and every partial sum stays below 2^24: the codes do, and
// an activation q = 256 hi + lo splits into lo (0..255) and 256 hi (hi
// -128..127), each exact in bf16. Each factor also carries its scale, a
// power of two: the weight's code times 2^(s - 128) (s its block's scale
// byte), the activation's lo and 256 hi times 2^-k (its block's 2^-k).
// Scaled so, every factor, product and partial sum is the same integer
// times one power of two, 2^(s - 128 - k), exact while that power keeps them
// normal floats (fold_fits; elsewhere the tiles take no part: rows whose
// scales fall outside run on the vectors, as do a product's tokens whose
// scales do). So one tile of 16 weight rows (a block's 32 values each)
// against two tiles of 16 tokens (their lo and their 256 hi halves), two
// tdpbf16ps into one zeroed tile, gives each row and token the block's
// exact sum already scaled: the number rows_grouped makes of its vpdpwssd
// sum by vscalefps. The vector unit adds it into the accumulator of the
// block's place in its group of eight (rows_grouped's lane pair 2p, 2p + 1),
// blocks in order; the row's eight accumulators then summed as hsum_rows
// sums its lanes: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)). (Scaling each
// block's sums on the vector unit instead, one vscalefps a row, had cost a
// quarter of the time: the 20b's prefill 1.06x without it.)
//
// Q8_0's codes (-128..127) against 256 hi would pass 2^24, so its blocks go
// through the tiles' int8 products instead: the codes as they are in the
// weights (a tile's 16 rows loaded straight from the matrix, one block's 32
// bytes each) against the tokens' lo bytes (unsigned: tdpbsud) and hi bytes
// (signed: tdpbssd), two int32 sums; 256 times the second plus the first is
// the block's exact sum, converted and added by rows_grouped's FMA (the
// weight's fp16 scale times the token's 2^-k). The other int8 formats'
// blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, and Q4_K's, Q5_K's and IQ4_XS's
// chunks) take the same products, their codes first decoded into int8 (a
// task's 16 rows once, for all its tiles of tokens), and the minimums' terms
// of the formats with them by a second FMA, as rows_grouped takes them.
#include "rows_avx512.h"
#if defined(__x86_64__) || defined(__i386__)
#include "amx.h"

#include <algorithm>
#include <vector>

namespace gd {

namespace {

constexpr size_t kTile = amx::kRows;          // 16 rows, 16 tokens
static_assert(kTile == kAmxTokens && amx_block_words(Format::MXFP4) == kTile * amx::kRowBytes);
#define GD_EACH_ROW _Pragma("GCC unroll 16")   // (a tile's accumulators in registers)

// (exact for the numbers here: integers with at most 8 significant bits)
inline uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

// MXFP4's values (kMxfp4Values) as bf16 words, for vpermw.
struct Bf16Table {
  alignas(64) uint16_t v[32];
};
Bf16Table bf16_table() {
  Bf16Table t{};
  for (int i = 0; i < 16; ++i) t.v[i] = bf16_of(float(kMxfp4Values[i]));
  return t;
}

// Where block b sits among a row's nbp (padded to whole groups): the blocks
// of each place in a group (b % 8) together, in order, so that a pass over
// one place reads its tiles one after another.
inline size_t slot(size_t b, size_t nbp) { return (b % kGroup) * (nbp / kGroup) + b / kGroup; }

// Whether MXFP4's rows [0, rows) may carry their scales on the tiles against
// activations scaled by 2^lo .. 2^hi (k): each value, code times 2^(s - 128),
// a normal bf16 (scale bytes 2..251), and each product and partial sum of a
// block, an integer below 2^24 times 2^(s - 128 + x), a normal float
// (2^-126 <= 2^(s - 128 + x) <= 2^103).
bool fold_fits(const uint8_t* W, size_t rb, size_t rows, size_t nb, AmxExponents k) {
  int lo = 255, hi = 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < nb; ++b) {
      const int s = W[r * rb + 17 * b];
      lo = std::min(lo, s), hi = std::max(hi, s);
    }
  if (lo < 2 || hi > 251) return false;
  return k.empty() || (lo - 128 + k.lo >= -126 && hi - 128 + k.hi <= 103);
}

// Rows [0, rows) of a task's 16 (the rest zeros) as bf16 values, each code
// times its block's 2^(s - 128) (added to the exponent of each nonzero
// word; fold_fits has checked): block b's tile of 16 rows at w + slot(b)
// 512, row r's 32 values 64 bytes after row r - 1's.
AVX512 void decode_rows(const uint8_t* W, size_t rb, size_t rows, size_t nb, uint16_t* w) {
  static const Bf16Table table = bf16_table();
  const __m512i tv = _mm512_load_si512(table.v);
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m512i nonzero = _mm512_set1_epi16(0x7FFF);   // (a word but its sign)
  const size_t nbp = grouped_blocks(nb);
  // block by block in the buffer's order, each tile's 16 rows in turn: the
  // stores in sequence (row by row, each row's blocks a kilobyte apart, the
  // decoding took 2.5x as long)
  for (size_t place = 0; place < kGroup; ++place)
    for (size_t b = place; b < nb; b += kGroup) {
      uint16_t* out = w + slot(b, nbp) * 512;
      for (size_t r = 0; r < kTile; ++r, out += 32) {
        if (r >= rows) {
          _mm512_store_si512(out, _mm512_setzero_si512());
          continue;
        }
        // a block: its scale byte, then 16 bytes whose low nibbles are codes
        // 0..15 and high nibbles 16..31
        const uint8_t* blk = W + r * rb + 17 * b;
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1));
        const __m128i lo = _mm_and_si128(x, low), hi = _mm_and_si128(_mm_srli_epi16(x, 4), low);
        const __m512i idx = _mm512_cvtepi8_epi16(   // (nibbles: sign extension is zero extension)
            _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
        const __m512i v = _mm512_permutexvar_epi16(idx, tv);
        const __m512i scale = _mm512_set1_epi16(int16_t((int(blk[0]) - 128) * 128));   // (the exponent's bits)
        _mm512_store_si512(out, _mm512_mask_add_epi16(v, _mm512_test_epi16_mask(v, nonzero), v, scale));
      }
    }
}

// The other int8 formats' rows [0, 16) as int8 codes, Q8_0's form
// (codes8: the values rows_grouped multiplies; a K-quant's chunks the blocks),
// block b's tile of 16 rows at out + 512 b, rows 32 bytes apart.
template <Format F>
AVX512 void decode_int8_rows(const uint8_t* W, size_t rb, size_t nb, uint8_t* out) {
  constexpr size_t chunks = block_values(F) / kBlock;
  for (size_t b = 0; b < nb; ++b)
    for (size_t r = 0; r < kTile; ++r)
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 512 * b + 32 * r),
                         x86::codes8<F>(W + r * rb + block_bytes(F) * (b / chunks), int(b % chunks)));
}

// A task's 16 rows' scales (ws[r nb + b]: the block's, a K-quant chunk's d
// sc) and minimums (wm: Q4_1's and Q5_1's m, the K-quants' -(dmin m)), the
// values rows_grouped takes.
AVX512 void task_scales(Format f, const uint8_t* W, size_t rb, size_t nb, float* ws, float* wm) {
  const size_t bb = block_bytes(f);
  for (size_t r = 0; r < kTile; ++r) {
    const uint8_t* row = W + r * rb;
    if (f == Format::Q4_K || f == Format::Q5_K) {
      for (size_t sb = 0; sb < nb / 8; ++sb) {
        uint32_t s[4];
        x86::k4_fields(row + bb * sb, s);
        _mm256_storeu_ps(ws + r * nb + 8 * sb, x86::scaled_bytes(s, row + bb * sb, x86::half_x86));
        _mm256_storeu_ps(wm + r * nb + 8 * sb, x86::scaled_bytes(s + 2, row + bb * sb + 2, x86::half_x86, -0.f));
      }
      continue;
    }
    if (f == Format::IQ4_XS) {
      for (size_t sb = 0; sb < nb / 8; ++sb) {
        float d[8][2], m[8][2];
        x86::iq4xs_superblock_scales(row + bb * sb, d, m, x86::half_x86);   // (superblock_scales' bits, inline)
        for (size_t j = 0; j < 8; ++j) ws[r * nb + 8 * sb + j] = d[j][0];
      }
      continue;
    }
    for (size_t b = 0; b < nb; ++b) {
      uint16_t h[2];
      std::memcpy(h, row + bb * b, 4);   // (each block's fp16 scale first, then a minimum's)
      ws[r * nb + b] = x86::half_x86(h[0]);
      if (has_min(f)) wm[r * nb + b] = x86::half_x86(h[1]);
    }
  }
}

// The tiles of int8 products (every grouped format but MXFP4): tiles 0, 1 and 4, 5 a block's two
// sums (lo, hi) in the two sets, 2 and 6 its rows (16 rows of 32 bytes), 3
// and 7 the tokens' lo and hi bytes (8 rows of 64: four bytes of each of 16
// tokens).
constexpr amx::TileConfig int8_tiles() {
  amx::TileConfig c = amx::full_tiles();
  c.colsb[2] = c.colsb[6] = 32;
  c.rows[3] = c.rows[7] = 8;
  return c;
}

// A block's sums, 16 rows x the 16 tokens of a tile: MXFP4's one fp32 tile,
// Q8_0's two int32 ones (its lo and hi bytes' sums).
template <Format F>
struct BlockSums {
  alignas(64) float v[kTile][kTile];
};
template <>
struct BlockSums<Format::Q8_0> {
  alignas(64) int32_t lo[kTile][kTile], hi[kTile][kTile];
};
template <>
struct BlockSums<Format::Q4_K> : BlockSums<Format::Q8_0> {};

// Where a task's rows are: MXFP4's decoded (w: slot(b) 512 words a block's
// tile, rows 64 bytes apart); the int8 formats' codes (block b's first row
// at q + bs b, rows rb bytes apart: Q8_0's in the matrix, Q4_0's and
// Q5_0's decoded).
struct TaskRows {
  const uint16_t* w;
  const uint8_t* q;
  size_t rb, bs;
};

// Block b (in slot s) of a tile of tokens (at: its AMX form) into out, by
// the tile set C (0 or 4).
template <Format F, int C>
inline void block_sums(const TaskRows& rows, const uint16_t* at, size_t b, size_t s, BlockSums<F>& out) {
  const uint16_t* lo = at + s * amx_block_words(F);   // the tokens' lo tile; their hi tile halfway on
  if constexpr (F == Format::MXFP4) {
    amx::zero<C>();
    amx::load<C + 1>(rows.w + s * 512, 64);
    amx::load<C + 2>(lo, 64);
    amx::load<C + 3>(lo + amx_block_words(F) / 2, 64);
    amx::dot_bf16<C, C + 1, C + 2>();
    amx::dot_bf16<C, C + 1, C + 3>();
    amx::store<C>(out.v, 64);
  } else {
    amx::zero<C>();
    amx::zero<C + 1>();
    amx::load<C + 2>(rows.q + rows.bs * b, rows.rb);
    amx::load<3>(lo, 64);
    amx::load<7>(lo + amx_block_words(F) / 2, 64);
    amx::dot_su8<C, C + 2, 3>();
    amx::dot_ss8<C + 1, C + 2, 7>();
    amx::store<C>(out.lo, 64);
    amx::store<C + 1>(out.hi, 64);
  }
}

// The rows of the thread's next task (the 16 after these), asked for into
// the L2 two lines a block while this task's products run: the first reader
// of a task's rows (fold_fits' scan, or Q8_0's tile loads) had waited on the
// memory line after line (the 20b's prefill: that scan a third of the
// profile's samples).
struct Ahead {
  const uint8_t* p;
  size_t bytes, done = 0;
  void step() {
    for (int i = 0; i < 2 && done < bytes; ++i, done += 64) _mm_prefetch(reinterpret_cast<const char*>(p + done), _MM_HINT_T1);
  }
};

// The i-th block of a pass into c[i % 2] by the tile set i % 2: a block's
// products overlap the previous block's scaling.
template <Format F>
inline void pass_block(const TaskRows& rows, const uint16_t* at, size_t b, size_t s, size_t i, BlockSums<F> (&c)[2]) {
  if (i % 2 == 0) block_sums<F, 0>(rows, at, b, s, c[0]);
  else block_sums<F, 4>(rows, at, b, s, c[1]);
}

// A task's 16 rows (the int8 formats': their scales as floats, ws[r nb +
// b], Q4_K's minimums wm) against one tile of 16 tokens (at, et, mt: its
// AMX form): sums[r][t], each row's sum over its blocks. (F: MXFP4, Q8_0 for
// every int8 format without minimums, Q4_K for those with them.)
template <Format F>
AVX512 void token_tile(const TaskRows& rows, const float* ws, const float* wm, const uint16_t* at, const float* et,
                       const float* mt, size_t nb, Ahead& ahead, float (&sums)[kTile][kTile]) {
  const size_t nbp = grouped_blocks(nb);
  BlockSums<F> c[2];
  alignas(64) float places[kGroup][kTile][kTile];   // each place's accumulators: place, row, token
  for (size_t place = 0; place < kGroup; ++place) {
    __m512 acc[kTile];
    GD_EACH_ROW
    for (size_t r = 0; r < kTile; ++r) acc[r] = _mm512_setzero_ps();
    const size_t blocks = place < nb ? (nb - place + kGroup - 1) / kGroup : 0;
    if (blocks > 0) pass_block<F>(rows, at, place, slot(place, nbp), 0, c);
    for (size_t i = 0; i < blocks; ++i) {
      const size_t b = place + kGroup * i;
      if (i + 1 < blocks) pass_block<F>(rows, at, b + kGroup, slot(b + kGroup, nbp), i + 1, c);
      const BlockSums<F>& x = c[i % 2];
      ahead.step();
      if constexpr (F == Format::MXFP4) {   // (scaled already)
        GD_EACH_ROW
        for (size_t r = 0; r < kTile; ++r) acc[r] = _mm512_add_ps(acc[r], _mm512_load_ps(x.v[r]));
      } else {
        const __m512 e = _mm512_load_ps(et + kTile * slot(b, nbp));   // 2^-k
        GD_EACH_ROW
        for (size_t r = 0; r < kTile; ++r) {
          const __m512 w = _mm512_set1_ps(ws[r * nb + b]);
          const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(x.hi[r]), 8),
                                               _mm512_load_si512(x.lo[r]));
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(w, e), acc[r]);
        }
        if constexpr (has_min(F)) {   // the minimums' terms: rows_grouped's second FMA
          const __m512 m = _mm512_load_ps(mt + kTile * slot(b, nbp));
          GD_EACH_ROW
          for (size_t r = 0; r < kTile; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(wm[r * nb + b]), m, acc[r]);
        }
      }
    }
    GD_EACH_ROW
    for (size_t r = 0; r < kTile; ++r) _mm512_store_ps(places[place][r], acc[r]);
  }
  GD_EACH_ROW
  for (size_t r = 0; r < kTile; ++r) {
    __m512 p[kGroup];
    for (size_t k = 0; k < kGroup; ++k) p[k] = _mm512_load_ps(places[k][r]);
    _mm512_store_ps(sums[r], _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[4]), _mm512_add_ps(p[2], p[6])),
                                           _mm512_add_ps(_mm512_add_ps(p[1], p[5]), _mm512_add_ps(p[3], p[7]))));
  }
}

}  // namespace

// Where code (v, i) of a block's grouped run (grouped_slot's j) goes in a
// token's column of the block's tile: MXFP4's bf16 pairs (row j / 2, the
// pair's j % 2), Q8_0's bytes in fours (row j / 4, the four's j % 4).
struct AmxPlaces {
  uint16_t mxfp4[8][4], q8[8][4];
};
constexpr AmxPlaces amx_places() {
  AmxPlaces p{};
  for (size_t v = 0; v < 8; ++v)
    for (size_t i = 0; i < 4; ++i) {
      const size_t j = grouped_slot(v, i);
      p.mxfp4[v][i] = uint16_t((j / 2) * 2 * kTile + j % 2);
      p.q8[v][i] = uint16_t((j / 4) * 4 * kTile + j % 4);
    }
  return p;
}
constexpr AmxPlaces kAmxPlaces = amx_places();

bool amx_acts(Format f, const int16_t* q, const float* d, const int32_t* e, const float* sd, size_t T, size_t nb,
              uint16_t* out, float* out_e, float* out_m, AmxExponents& k) {
  const size_t nbp = grouped_blocks(nb);
  const size_t per_block = amx_block_words(f), half = per_block / 2;   // words
  k = {};   // (out and out_e arrive zeroed: a last tile's missing tokens stay zeros)
  for (size_t t = 0; t < T; ++t) {
    const size_t u = t / kTile, tok = t % kTile;
    for (size_t b = 0; b < nb; ++b) {
      const size_t run = grouped_block(t, b - b % kGroup, T, nbp), p = b % kGroup;
      const int16_t* codes = q + run * kBlock + p * 4;   // (code (v, i) at v kBlock + i)
      const size_t at_slot = u * nbp + slot(b, nbp);
      if (f == Format::MXFP4) {
        uint16_t* lo = out + at_slot * per_block + tok * 2;
        // the block's 2^-k, a normal float for every k (products of zero
        // codes only, where it may be out of fold_fits' range, are zeros)
        const int x = e[run + p] - kGroupedScaleBias;   // -k
        const float scale = pow2(x);
        bool zeros = true;
        for (size_t v = 0; v < 8; ++v)
          for (size_t i = 0; i < 4; ++i) {
            const int c = codes[v * kBlock + i];
            zeros = zeros && c == 0;
            const size_t at = kAmxPlaces.mxfp4[v][i];
            lo[at] = bf16_of(float(c & 0xFF) * scale);
            lo[half + at] = bf16_of(float((c >> 8) * 256) * scale);
          }
        if (!zeros)   // the range of the scales, over the blocks with a code other than 0
          k = k.empty() ? AmxExponents{x, x} : AmxExponents{std::min(k.lo, x), std::max(k.hi, x)};
      } else {
        uint8_t* bytes = reinterpret_cast<uint8_t*>(out + at_slot * per_block) + tok * 4;
        for (size_t v = 0; v < 8; ++v)
          for (size_t i = 0; i < 4; ++i) {
            const int c = codes[v * kBlock + i];
            const size_t at = kAmxPlaces.q8[v][i];
            bytes[at] = uint8_t(c & 0xFF);
            bytes[2 * half + at] = uint8_t(c >> 8);   // (half: words)
          }
        out_e[at_slot * kTile + tok] = d[run + p];
        if (out_m) out_m[at_slot * kTile + tok] = sd[run + p];
      }
    }
  }
  // (256 hi times 2^-k beyond bf16's largest: the form is not used)
  return f != Format::MXFP4 || k.empty() || k.hi <= 112;
}

AVX512 void rows_amx(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                     float* Y, size_t ldy, const float* bias) {
  const size_t nb = K / kBlock, nbp = grouped_blocks(nb), rb = row_bytes(f, K);
  const size_t per_block = amx_block_words(f);
  // (each thread's, kept between calls; aligned: the decoded rows are tiles)
  static thread_local std::vector<uint16_t, LineAligned<uint16_t>> w_buf;
  static thread_local std::vector<float> ws_buf, wm_buf;
  if (f == Format::MXFP4) w_buf.resize(kTile * nbp * 32);
  else ws_buf.resize(kTile * nb);
  if (f != Format::MXFP4 && f != Format::Q8_0) w_buf.resize(kTile * nb * 16);   // (decoded int8: 512 bytes a block)
  if (has_min(f)) wm_buf.resize(kTile * nb);
  uint16_t* w = w_buf.data();
  float *ws = ws_buf.data(), *wm = wm_buf.data();
  static const amx::TileConfig bf16 = amx::full_tiles(), int8 = int8_tiles();
  amx::configure(f == Format::MXFP4 ? bf16 : int8);
  alignas(64) float sums[kTile][kTile];
  for (size_t n = n0; n < n1; n += kTile) {
    const size_t rows = std::min(kTile, n1 - n);
    if (f == Format::MXFP4) {
      if (!fold_fits(W + n * rb, rb, rows, nb, a.amx_k)) {   // (scales beyond the tiles' floats: the vectors)
        rows_avx512_grouped(f, W, n, n + rows, K, a, T, Y, ldy, bias);
        continue;
      }
      decode_rows(W + n * rb, rb, rows, nb, w);
    } else if (rows < kTile) {   // (Q8_0's tiles load whole rows from the matrix: a short task's the vectors')
      rows_avx512_grouped(f, W, n, n1, K, a, T, Y, ldy, bias);
      break;
    } else {
      task_scales(f, W + n * rb, rb, nb, ws, wm);
      uint8_t* codes = reinterpret_cast<uint8_t*>(w);
      switch (f) {
        case Format::Q4_0: decode_int8_rows<Format::Q4_0>(W + n * rb, rb, nb, codes); break;
        case Format::Q4_1: decode_int8_rows<Format::Q4_1>(W + n * rb, rb, nb, codes); break;
        case Format::Q5_0: decode_int8_rows<Format::Q5_0>(W + n * rb, rb, nb, codes); break;
        case Format::Q5_1: decode_int8_rows<Format::Q5_1>(W + n * rb, rb, nb, codes); break;
        case Format::Q4_K: decode_int8_rows<Format::Q4_K>(W + n * rb, rb, nb, codes); break;
        case Format::Q5_K: decode_int8_rows<Format::Q5_K>(W + n * rb, rb, nb, codes); break;
        case Format::IQ4_NL: decode_int8_rows<Format::IQ4_NL>(W + n * rb, rb, nb, codes); break;
        case Format::IQ4_XS: decode_int8_rows<Format::IQ4_XS>(W + n * rb, rb, nb, codes); break;
        default: break;   // (Q8_0: its codes in the matrix)
      }
    }
    const bool decoded = f != Format::MXFP4 && f != Format::Q8_0;
    const TaskRows task = decoded ? TaskRows{w, reinterpret_cast<const uint8_t*>(w), 32, 512}
                                  : TaskRows{w, W + n * rb + 2, rb, 34};   // (Q8_0's codes after its scale)
    Ahead ahead{W + (n + kTile) * rb, kTile * rb};   // (past the matrix's end: prefetches do not fault)
    for (size_t t0 = 0; t0 < T; t0 += kTile) {
      const size_t u = t0 / kTile;
      const uint16_t* at = a.amx + u * nbp * per_block;
      const float* et = a.amx_e ? a.amx_e + u * nbp * kTile : nullptr;   // (the int8 formats')
      const float* mt = a.amx_m ? a.amx_m + u * nbp * kTile : nullptr;   // (Q4_K's)
      if (f == Format::MXFP4) token_tile<Format::MXFP4>(task, ws, wm, at, et, mt, nb, ahead, sums);
      else if (has_min(f)) token_tile<Format::Q4_K>(task, ws, wm, at, et, mt, nb, ahead, sums);
      else token_tile<Format::Q8_0>(task, ws, wm, at, et, mt, nb, ahead, sums);
      for (size_t r = 0; r < rows; ++r)
        for (size_t t = 0; t < std::min(kTile, T - t0); ++t)
          Y[(t0 + t) * ldy + n + r] = sums[r][t] + (bias ? bias[n + r] : 0.f);
    }
  }
  amx::release();
}

}  // namespace gd
#endif
