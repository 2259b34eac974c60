// SHA-256 (FIPS 180-4), for cache keys and entry checksums. Our own small
// implementation so the cache needs no crypto library.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kdtree::cache {

using Digest = std::array<std::uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // Pads and returns the digest; the object is reset and may be reused.
  Digest finish();

  static Digest hash(const void* data, std::size_t size);
  static Digest hash(std::string_view data) { return hash(data.data(), data.size()); }

 private:
  void reset();
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_;
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

// Lower-case hex of a digest (64 characters).
std::string to_hex(const Digest& digest);

}  // namespace kdtree::cache
