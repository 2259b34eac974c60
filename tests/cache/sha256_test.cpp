#include "cache/sha256.hpp"

#include <doctest/doctest.h>

#include <string>

using kdtree::cache::Sha256;
using kdtree::cache::to_hex;

namespace {
std::string hex_of(const std::string& s) { return to_hex(Sha256::hash(s)); }
}  // namespace

TEST_CASE("sha256: FIPS 180-2 vectors") {
  CHECK(hex_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex_of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex_of(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256: padding edges around the 56- and 64-byte boundaries") {
  // Expected values from coreutils sha256sum.
  const std::pair<int, const char*> cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (const auto& [n, expected] : cases) {
    INFO("sha256[len=" << n << " x 'a']");
    CHECK(hex_of(std::string(n, 'a')) == expected);
  }
}

TEST_CASE("sha256: incremental updates equal one shot - and finish() resets") {
  std::string msg;
  for (int i = 0; i < 300; ++i) msg += char(i * 7 + 3);
  const std::string whole = hex_of(msg);
  Sha256 h;
  for (std::size_t split = 0; split <= msg.size(); split += 13) {
    INFO("sha256[split=" << split << "]");
    h.update(msg.substr(0, split));
    h.update(msg.substr(split, 1));  // a one-byte piece, then the rest
    if (split < msg.size()) h.update(msg.substr(split + 1));
    CHECK(to_hex(h.finish()) == whole);
  }
  // Byte at a time.
  for (char c : msg) h.update(&c, 1);
  CHECK(to_hex(h.finish()) == whole);
}
