// Byte-level BPE tokenizer for GPT-OSS (o200k_harmony): the o200k
// pre-tokenizer (tiktoken's "gpt-4o" regex, hand-compiled) followed by BPE
// that merges the adjacent pair whose concatenation has the lowest rank,
// where a token's rank is its id. This is what tiktoken computes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gd {

// GGUF token types (llama.cpp's llama_token_type).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

class Tokenizer {
 public:
  // Token i's GGUF string is buf[starts[i] : starts[i] + lengths[i]]. Normal
  // tokens are GPT-2 byte-to-unicode strings; control and user-defined tokens
  // are special (their text is literal). Throws std::invalid_argument naming
  // the token when a normal token's string is not in the GPT-2 byte alphabet.
  Tokenizer(const uint8_t* buf, const int64_t* starts, const int64_t* lengths, const int32_t* types,
            size_t n_tokens);

  // Encode UTF-8 text. With allow_special, special-token strings in the text
  // become their ids; otherwise they are ordinary text.
  std::vector<uint32_t> encode(std::string_view text, bool allow_special) const;
  // Concatenated bytes of the tokens; throws std::out_of_range for a bad id.
  std::string decode(const int64_t* ids, size_t n) const;
  // The o200k pre-tokenizer alone: byte offsets where pieces start, plus the end.
  std::vector<size_t> split(std::string_view text) const;

  size_t size() const { return offsets_.size() - 1; }
  std::string_view token_bytes(size_t id) const {
    return std::string_view(blob_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  bool is_special(size_t id) const { return special_[id] != 0; }

 private:
  int64_t lookup_rank(const uint8_t* p, size_t len) const;  // -1 when not a normal token
  int64_t lookup_special(const uint8_t* p, size_t len) const;
  void encode_ordinary(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const;
  void encode_piece(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const;
  void bpe_small(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const;
  void bpe_large(const uint8_t* p, size_t len, std::vector<uint32_t>& out) const;

  std::string blob_;               // every token's bytes, back to back
  std::vector<size_t> offsets_;    // token i = blob_[offsets_[i] : offsets_[i+1]]
  std::vector<uint8_t> special_;   // 1 for control / user-defined tokens
  std::vector<uint32_t> table_;    // open addressing: normal token id + 1, 0 = empty
  std::vector<uint32_t> special_ids_;
  std::vector<size_t> special_lengths_;  // distinct lengths, longest first
  bool special_first_[256] = {};
  size_t mask_ = 0;
};

}  // namespace gd
