#include "bpe.h"

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <queue>
#include <stdexcept>

#include "unicode_classes.h"

namespace gd {
namespace {

// ---- code point classes ---------------------------------------------------
// The only distinctions the o200k pattern makes (values match the generator).
enum Cls : uint8_t { OTHER = 0, LU = 1, LL = 2, LO = 3, MK = 4, NUM = 5, WS = 6 };

const uint8_t* class_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x110000, OTHER);
    for (const auto& r : kUnicodeRanges)
      for (uint32_t c = r.lo; c <= r.hi; ++c) t[c] = r.cls;
    return t;
  }();
  return table.data();
}

inline bool in_upper(uint8_t c) { return c == LU || c == LO || c == MK; }  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
inline bool in_lower(uint8_t c) { return c == LL || c == LO || c == MK; }  // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
inline bool is_letter(uint8_t c) { return c == LU || c == LL || c == LO; }
inline bool is_newline(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Decode UTF-8 into code points with their byte offsets (offsets has n+1
// entries). Invalid bytes (not produced by Python's encoder) become U+FFFD.
void decode_utf8(const uint8_t* p, size_t len, std::vector<uint32_t>& cps, std::vector<size_t>& offsets) {
  cps.clear();
  offsets.clear();
  size_t i = 0;
  while (i < len) {
    offsets.push_back(i);
    const uint8_t b = p[i];
    uint32_t cp;
    size_t n;
    if (b < 0x80) { cp = b; n = 1; }
    else if ((b >> 5) == 0x6 && i + 1 < len) { cp = ((b & 0x1F) << 6) | (p[i + 1] & 0x3F); n = 2; }
    else if ((b >> 4) == 0xE && i + 2 < len) { cp = ((b & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F); n = 3; }
    else if ((b >> 3) == 0x1E && i + 3 < len) {
      cp = ((b & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
      n = 4;
    } else { cp = 0xFFFD; n = 1; }
    if (cp >= 0x110000) cp = 0xFFFD;
    cps.push_back(cp);
    i += n;
  }
  offsets.push_back(len);
}

// The o200k pre-tokenizer: tiktoken's pattern, an alternation tried in order
// at each position (leftmost-first, with backtracking), compiled by hand:
//   1  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   2  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   3  \p{N}{1,3}
//   4   ?[^\s\p{L}\p{N}]+[\r\n/]*
//   5  \s*[\r\n]+
//   6  \s+(?!\S)
//   7  \s+
class Splitter {
 public:
  Splitter(const std::vector<uint32_t>& cps, const uint8_t* table) : cp_(cps), n_(cps.size()) {
    cls_.resize(n_);
    for (size_t i = 0; i < n_; ++i) cls_[i] = table[cps[i]];
  }

  // End (code point index) of the piece that starts at i.
  size_t next(size_t i) const {
    long e;
    if ((e = letters_lower(i)) >= 0) return size_t(e);
    if ((e = letters_upper(i)) >= 0) return size_t(e);
    if (cls_[i] == NUM) {  // 3
      size_t j = i;
      while (j < n_ && j - i < 3 && cls_[j] == NUM) ++j;
      return j;
    }
    if ((e = punctuation(i)) >= 0) return size_t(e);
    // 5, 6, 7: whitespace (every remaining code point is whitespace).
    size_t run = i;
    while (run < n_ && cls_[run] == WS) ++run;
    if (run == i) return i + 1;  // unreachable: every class is covered above
    for (size_t p = run; p > i; --p)
      if (is_newline(cp_[p - 1])) return p;      // 5: up to the last newline of the run
    if (run == n_) return run;                   // 6: (?!\S) holds at the end
    if (run - 1 > i) return run - 1;             // 6: leave the last space to the next piece
    return run;                                  // 7
  }

 private:
  bool prefix_ok(size_t i) const {  // [^\r\n\p{L}\p{N}]
    return !is_newline(cp_[i]) && !is_letter(cls_[i]) && cls_[i] != NUM;
  }
  bool is_punct(size_t i) const {  // [^\s\p{L}\p{N}]
    return cls_[i] != WS && !is_letter(cls_[i]) && cls_[i] != NUM;
  }
  static uint32_t fold(uint32_t c) {  // simple case folding, as far as the suffixes need
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c == 0x17F) return 's';  // LATIN SMALL LETTER LONG S folds to s
    return c;
  }
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)? at i.
  size_t contraction(size_t i) const {
    if (i >= n_ || cp_[i] != '\'') return i;
    static const char* kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (const char* s : kSuffixes) {
      size_t k = 0;
      while (s[k] && i + 1 + k < n_ && fold(cp_[i + 1 + k]) == uint32_t(s[k])) ++k;
      if (!s[k]) return i + 1 + k;
    }
    return i;
  }
  // Pattern 1: optional prefix, upper*, lower+, contraction.
  long letters_lower(size_t i) const {
    for (int with_prefix = prefix_ok(i) ? 1 : 0; with_prefix >= 0; --with_prefix) {
      const size_t s = i + size_t(with_prefix);
      size_t e = s;
      while (e < n_ && in_upper(cls_[e])) ++e;
      if (e < n_ && in_lower(cls_[e])) {
        while (e < n_ && in_lower(cls_[e])) ++e;
        return long(contraction(e));
      }
      // Backtrack upper*: lower+ takes the last lower-class code point of the run.
      for (size_t p = e; p > s; --p)
        if (in_lower(cls_[p - 1])) return long(contraction(p));
    }
    return -1;
  }
  // Pattern 2: optional prefix, upper+, lower*, contraction.
  long letters_upper(size_t i) const {
    for (int with_prefix = prefix_ok(i) ? 1 : 0; with_prefix >= 0; --with_prefix) {
      const size_t s = i + size_t(with_prefix);
      size_t e = s;
      while (e < n_ && in_upper(cls_[e])) ++e;
      if (e == s) continue;
      while (e < n_ && in_lower(cls_[e])) ++e;
      return long(contraction(e));
    }
    return -1;
  }
  // Pattern 4: optional space, punctuation+, then newlines and slashes.
  long punctuation(size_t i) const {
    size_t s = (cp_[i] == ' ' && i + 1 < n_ && is_punct(i + 1)) ? i + 1 : i;
    if (!is_punct(s)) return -1;
    size_t e = s;
    while (e < n_ && is_punct(e)) ++e;
    while (e < n_ && (is_newline(cp_[e]) || cp_[e] == '/')) ++e;
    return long(e);
  }

  const std::vector<uint32_t>& cp_;
  std::vector<uint8_t> cls_;
  size_t n_;
};

inline uint64_t hash_bytes(const uint8_t* p, size_t len) {
  uint64_t h = 1469598103934665603ull ^ (len * 0x9E3779B97F4A7C15ull);
  for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

// GPT-2's byte-to-unicode alphabet, inverted: code point -> byte, or -1.
std::vector<int> gpt2_unicode_to_byte() {
  std::vector<int> inv(512, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inv[printable ? b : 256 + extra++] = b;
  }
  return inv;
}

// Bytes as printable ASCII, every other byte as \xNN.
std::string escaped(const uint8_t* s, size_t len) {
  std::string out;
  char buf[8];
  for (size_t i = 0; i < len; ++i) {
    if (s[i] >= 0x20 && s[i] < 0x7F && s[i] != '\\') {
      out += char(s[i]);
    } else {
      std::snprintf(buf, sizeof buf, "\\x%02X", s[i]);
      out += buf;
    }
  }
  return out;
}

std::string hex_cp(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", cp);
  return buf;
}

}  // namespace

Tokenizer::Tokenizer(const uint8_t* buf, const int64_t* starts, const int64_t* lengths, const int32_t* types,
                     size_t n_tokens) {
  static const std::vector<int> inv = gpt2_unicode_to_byte();
  offsets_.reserve(n_tokens + 1);
  special_.assign(n_tokens, 0);
  std::vector<uint32_t> cps;
  std::vector<size_t> cp_offsets;
  for (size_t id = 0; id < n_tokens; ++id) {
    offsets_.push_back(blob_.size());
    const uint8_t* s = buf + starts[id];
    const size_t len = size_t(lengths[id]);
    if (types[id] == kNormal) {
      decode_utf8(s, len, cps, cp_offsets);
      for (uint32_t cp : cps) {
        const int b = cp < inv.size() ? inv[cp] : -1;
        if (b < 0 && cp == 0xFFFD)   // (its bytes are not UTF-8: shown escaped, the message must be text)
          throw std::invalid_argument("token " + std::to_string(id) + " (bytes " + escaped(s, len) +
                                      ") holds bytes that are not UTF-8 (or U+FFFD), which no token of a 'gpt2' vocabulary holds");
        if (b < 0)
          throw std::invalid_argument("token " + std::to_string(id) + " '" + std::string((const char*)s, len) +
                                      "': character " + hex_cp(cp) +
                                      " is not in the GPT-2 byte-level alphabet of a 'gpt2' vocabulary");
        blob_.push_back(char(b));
      }
    } else {
      blob_.append(reinterpret_cast<const char*>(s), len);
      if (types[id] == kControl || types[id] == kUserDefined) {
        if (len == 0) throw std::invalid_argument("special token " + std::to_string(id) + " is empty");
        special_[id] = 1;
        special_ids_.push_back(uint32_t(id));
        special_first_[s[0]] = true;
        if (std::find(special_lengths_.begin(), special_lengths_.end(), len) == special_lengths_.end())
          special_lengths_.push_back(len);
      }
    }
  }
  offsets_.push_back(blob_.size());
  std::sort(special_lengths_.rbegin(), special_lengths_.rend());

  // One table for normal tokens (ranks) and special tokens (told apart by type).
  size_t cap = 1;
  while (cap < 2 * n_tokens + 2) cap <<= 1;
  table_.assign(cap, 0);
  mask_ = cap - 1;
  for (size_t id = 0; id < n_tokens; ++id) {
    if (types[id] != kNormal && !special_[id]) continue;
    const auto tb = token_bytes(id);
    size_t slot = hash_bytes(reinterpret_cast<const uint8_t*>(tb.data()), tb.size()) & mask_;
    bool duplicate = false;
    while (table_[slot] != 0) {
      const uint32_t other = table_[slot] - 1;
      if (token_bytes(other) == tb && special_[other] == special_[id]) { duplicate = true; break; }
      slot = (slot + 1) & mask_;
    }
    if (!duplicate) table_[slot] = uint32_t(id + 1);  // the lowest id wins, as in a rank map
  }
  // Byte-level BPE ends every piece in single bytes: each of the 256 must be
  // a token, or some text could not be encoded at all.
  for (int b = 0; b < 256; ++b) {
    const uint8_t byte = uint8_t(b);
    if (lookup_rank(&byte, 1) < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw std::invalid_argument(std::string("no token holds the byte ") + hex +
                                  ": a byte-level vocabulary has one for each of the 256 bytes");
    }
  }
}

int64_t Tokenizer::lookup_rank(const uint8_t* p, size_t len) const {
  const std::string_view key(reinterpret_cast<const char*>(p), len);
  for (size_t slot = hash_bytes(p, len) & mask_; table_[slot] != 0; slot = (slot + 1) & mask_) {
    const uint32_t id = table_[slot] - 1;
    if (!special_[id] && token_bytes(id) == key) return id;
  }
  return -1;
}

int64_t Tokenizer::lookup_special(const uint8_t* p, size_t len) const {
  const std::string_view key(reinterpret_cast<const char*>(p), len);
  for (size_t slot = hash_bytes(p, len) & mask_; table_[slot] != 0; slot = (slot + 1) & mask_) {
    const uint32_t id = table_[slot] - 1;
    if (special_[id] && token_bytes(id) == key) return id;
  }
  return -1;
}

// Short pieces: tiktoken's scan for the lowest-ranked adjacent pair.
void Tokenizer::bpe_small(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const {
  constexpr int64_t kNone = INT64_MAX;
  struct Part { size_t start; int64_t rank; };
  Part parts[66];
  auto pair_rank = [&](size_t n_parts, size_t i) -> int64_t {
    if (i + 2 >= n_parts) return kNone;  // needs parts i, i+1 and the end marker i+2
    const int64_t r = lookup_rank(p + parts[i].start, parts[i + 2].start - parts[i].start);
    return r < 0 ? kNone : r;
  };
  size_t n = len + 1;  // len single-byte parts plus an end marker
  for (size_t i = 0; i < n; ++i) parts[i] = {i, kNone};
  for (size_t i = 0; i + 2 < n; ++i) parts[i].rank = pair_rank(n, i);
  while (n > 2) {
    size_t best = 0;
    int64_t best_rank = kNone;
    for (size_t i = 0; i + 2 < n; ++i)
      if (parts[i].rank < best_rank) { best_rank = parts[i].rank; best = i; }
    if (best_rank == kNone) break;
    std::memmove(&parts[best + 1], &parts[best + 2], (n - best - 2) * sizeof(Part));
    --n;
    parts[best].rank = pair_rank(n, best);
    if (best > 0) parts[best - 1].rank = pair_rank(n, best - 1);
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    const int64_t r = lookup_rank(p + parts[i].start, parts[i + 1].start - parts[i].start);
    if (r < 0) throw std::runtime_error("the vocabulary lacks a single-byte token");
    out.push_back(uint32_t(r));
  }
}

// Long pieces: the same merge order with a heap, O(n log n) instead of O(n^2).
void Tokenizer::bpe_large(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const {
  // Part i starts at byte i while alive; next_[i] is the following part's start (len at the end).
  std::vector<size_t> next(len), prev(len);
  std::vector<uint8_t> alive(len, 1);
  for (size_t i = 0; i < len; ++i) { next[i] = i + 1; prev[i] = i == 0 ? SIZE_MAX : i - 1; }
  struct Entry { int64_t rank; size_t start, end; };
  auto later = [](const Entry& a, const Entry& b) { return a.rank != b.rank ? a.rank > b.rank : a.start > b.start; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> heap(later);
  auto push_pair = [&](size_t i) {
    if (i == SIZE_MAX || next[i] >= len) return;
    const size_t end = next[next[i]];
    const int64_t r = lookup_rank(p + i, end - i);
    if (r >= 0) heap.push({r, i, end});
  };
  for (size_t i = 0; i + 1 < len; ++i) push_pair(i);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    if (!alive[e.start] || next[e.start] >= len || next[next[e.start]] != e.end) continue;  // stale
    const size_t absorbed = next[e.start];
    alive[absorbed] = 0;
    next[e.start] = next[absorbed];
    if (next[e.start] < len) prev[next[e.start]] = e.start;
    push_pair(e.start);
    push_pair(prev[e.start]);
  }
  for (size_t i = 0; i < len; i = next[i]) {
    const int64_t r = lookup_rank(p + i, next[i] - i);
    if (r < 0) throw std::runtime_error("the vocabulary lacks a single-byte token");
    out.push_back(uint32_t(r));
  }
}

void Tokenizer::encode_piece(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const {
  const int64_t whole = lookup_rank(p, len);
  if (whole >= 0) { out.push_back(uint32_t(whole)); return; }
  if (len <= 64) bpe_small(p, len, out);
  else bpe_large(p, len, out);
}

void Tokenizer::encode_ordinary(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const {
  if (len == 0) return;
  std::vector<uint32_t> cps;
  std::vector<size_t> offs;
  decode_utf8(p, len, cps, offs);
  Splitter splitter(cps, class_table());
  for (size_t i = 0; i < cps.size();) {
    const size_t e = splitter.next(i);
    encode_piece(p + offs[i], offs[e] - offs[i], out);
    i = e;
  }
}

std::vector<size_t> Tokenizer::split(std::string_view text) const {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  std::vector<uint32_t> cps;
  std::vector<size_t> offs, out;
  decode_utf8(p, text.size(), cps, offs);
  Splitter splitter(cps, class_table());
  for (size_t i = 0; i < cps.size(); i = splitter.next(i)) out.push_back(offs[i]);
  out.push_back(text.size());
  return out;
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 8);
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t len = text.size();
  size_t segment = 0;
  if (allow_special && !special_ids_.empty()) {
    for (size_t i = 0; i < len;) {
      int64_t id = -1;
      size_t match = 0;
      if (special_first_[p[i]]) {
        for (size_t L : special_lengths_) {  // longest first
          if (L > len - i) continue;
          if ((id = lookup_special(p + i, L)) >= 0) { match = L; break; }
        }
      }
      if (id < 0) { ++i; continue; }
      encode_ordinary(p + segment, i - segment, out);
      out.push_back(uint32_t(id));
      i += match;
      segment = i;
    }
  }
  encode_ordinary(p + segment, len - segment, out);
  return out;
}

std::string Tokenizer::decode(const int64_t* ids, size_t n) const {
  std::string out;
  for (size_t k = 0; k < n; ++k) {
    if (ids[k] < 0 || size_t(ids[k]) >= size())
      throw std::out_of_range("token id " + std::to_string(ids[k]) + " at position " + std::to_string(k) +
                              " is outside the vocabulary (0.." + std::to_string(size() - 1) + ")");
    out.append(token_bytes(size_t(ids[k])));
  }
  return out;
}

}  // namespace gd
