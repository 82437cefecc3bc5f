#include "gguf_scan.h"

#include <cstring>

namespace gd {

StringArrayScan scan_string_array(const uint8_t* buf, size_t size, size_t offset, size_t count,
                                  int64_t* starts, int64_t* lengths) {
  size_t pos = offset;
  for (size_t i = 0; i < count; ++i) {
    if (pos > size || size - pos < 8)
      throw std::out_of_range("string " + std::to_string(i) + " of " + std::to_string(count) +
                              ": its length field at byte " + std::to_string(pos) +
                              " is past the end of the file (" + std::to_string(size) + " bytes)");
    uint64_t len;
    std::memcpy(&len, buf + pos, 8);
    pos += 8;
    if (len > size - pos)
      throw std::out_of_range("string " + std::to_string(i) + " of " + std::to_string(count) +
                              ": " + std::to_string(len) + " bytes at byte " + std::to_string(pos) +
                              " run past the end of the file (" + std::to_string(size) + " bytes)");
    starts[i] = int64_t(pos);
    lengths[i] = int64_t(len);
    pos += len;
  }
  return {pos};
}

}  // namespace gd
