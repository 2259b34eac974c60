// Issue 15 defect 2: a cache entry whose checksum is right but whose payload
// does not unpack (bad framing) or whose ptxas log does not parse failed its
// kernel forever ("malformed", "internal error: stoi") and `cache verify`
// called it valid. Such an entry is bad: rebuilt, and reported.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "cache/sha256.hpp"
#include "runtime/runtime.hpp"
#include "tests/cache/cache_test_util.hpp"

using namespace kdtree;
using kdtree::cache::test::read_file;
using kdtree::cache::test::TempDir;
using kdtree::cache::test::write_file;

namespace {

std::vector<char> payload(const std::string& log, const std::string& cubin, std::uint32_t log_bytes) {
  std::string p = "KDMD";
  p.append(reinterpret_cast<const char*>(&log_bytes), 4);
  p += log + cubin;
  return {p.begin(), p.end()};
}
std::vector<char> payload(const std::string& log, const std::string& cubin) {
  return payload(log, cubin, std::uint32_t(log.size()));
}

const std::string kBadLog =
    "ptxas info    : Function properties for kdtree_k\n"
    "    99999999999 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";

// Replaces the payload of the one entry in dir, with a right checksum (the
// format of cache/disk_cache.cpp: header 84 bytes, payload size at 8, tag size
// at 16, checksum at 20..52 over everything else).
void replace_payload(const std::filesystem::path& dir,
                     const std::function<std::vector<char>(const std::string&)>& make) {
  const auto files = kdtree::cache::test::entries(dir);
  REQUIRE(files.size() == 1);
  std::string text = read_file(files[0]);
  std::uint32_t tag_size = 0;
  std::memcpy(&tag_size, text.data() + 16, 4);
  const std::string old_payload = text.substr(84 + tag_size);
  std::uint32_t log_bytes = 0;
  std::memcpy(&log_bytes, old_payload.data() + 4, 4);
  const std::vector<char> p = make(old_payload.substr(8 + log_bytes));  // given the cubin
  text = text.substr(0, 84 + tag_size) + std::string(p.begin(), p.end());
  const std::uint64_t size = p.size();
  std::memcpy(text.data() + 8, &size, 8);
  kdtree::cache::Sha256 h;
  h.update(text.data(), 20);
  h.update(text.data() + 52, text.size() - 52);
  const auto sum = h.finish();
  std::memcpy(text.data() + 20, sum.data(), 32);
  write_file(files[0], text);
}

}  // namespace

TEST_CASE("cache payload check: framing, cubin and ptxas log[good, no magic, log past the end, not ELF, bad number]") {
  const std::string elf = std::string(
                              "\x7f"
                              "ELF",
                              4) +
                          "rest";
  CHECK(cache_payload_problem(payload("ptxas info    : Used 32 registers\n", elf)) == "");
  CHECK(cache_payload_problem({'K', 'D'}) == "no KDMD header");
  CHECK(cache_payload_problem(payload("log", elf, 1000)) == "log size 1000 past the end");
  CHECK(cache_payload_problem(payload("log", "not a cubin")) == "the cubin is not an ELF image");
  CHECK(cache_payload_problem(payload(kBadLog, elf)).find("ptxas report: number out of range") == 0);
  // The parser says so as a kdtree error, not std::stoi's out_of_range ("internal error: stoi").
  try {
    parse_ptxas_log(kBadLog);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.status() == KDTREE_ERROR_COMPILE);
  }
}

TEST_CASE("a cache entry whose payload does not unpack or parse is rebuilt[bad ptxas number, bad framing]") {
  TempDir tmp;
  codegen::KernelSource src;
  src.op = "tiny";
  src.label = "tiny[test]";
  src.file_stem = "tiny-test";
  src.source = "extern \"C\" __global__ void kdtree_k(int* p) { *p = 1; }\n";
  const std::string elf_magic(
      "\x7f"
      "ELF",
      4);
  CHECK(Engine::offline(90, tmp.path.string())->compile(src)->outcome == cache::Outcome::built);

  SUBCASE("a log that does not parse") {
    replace_payload(tmp.path, [&](const std::string& cubin) { return payload(kBadLog, cubin); });
  }
  SUBCASE("framing past the end") {
    replace_payload(tmp.path, [&](const std::string& cubin) { return payload("", cubin, 1u << 30); });
  }
  const auto listed = cache::DiskCache(tmp.path, cache_options()).list();
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed[0].valid);
  CHECK(listed[0].problem.find("payload: ") == 0);

  auto again = Engine::offline(90, tmp.path.string())->compile(src);  // threw before: every time
  CHECK(again->outcome == cache::Outcome::built);
  CHECK(std::string(again->cubin.begin(), again->cubin.begin() + 4) == elf_magic);
  CHECK(Engine::offline(90, tmp.path.string())->compile(src)->outcome == cache::Outcome::disk_hit);
}
