// Walking GGUF string arrays (u64 length + bytes, repeated) in native code:
// the vocabulary (201,088 strings) and merges (446,189) would take most of a
// second to walk in Python.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gd {

struct StringArrayScan {
  size_t end;  // offset just past the last string
};

// Fill starts[i] / lengths[i] with the byte offset and length of string i of an
// array of `count` strings beginning at `offset` in buf[0:size]. Throws
// std::out_of_range naming the string index if the array runs past `size`.
StringArrayScan scan_string_array(const uint8_t* buf, size_t size, size_t offset, size_t count,
                                  int64_t* starts, int64_t* lengths);

}  // namespace gd
