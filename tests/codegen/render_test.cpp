// The translation unit of a template: the config prelude must match the
// template's config header exactly, and flatten() inlines the named headers.
#include <doctest/doctest.h>

#include <string>

#include "base/error.hpp"
#include "codegen/render.hpp"
#include "codegen/template_store.hpp"

using kdtree::codegen::config_prelude;

namespace {

const char* const kConfig =
    "#ifndef KD_N\n#define KD_N 4\n#endif\n#ifndef KD_TYPE_BF16\n#define KD_TYPE_BF16 1\n#endif\n";

std::string error_of(const char* config, const kdtree::codegen::Params& params) {
  try {
    config_prelude("t_config.h", config, params);
  } catch (const kdtree::Error& e) {
    CHECK(e.status() == KDTREE_ERROR_INTERNAL);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config_prelude defines every value the config header declares") {
  CHECK(config_prelude("t_config.h", kConfig, {{"N", "8"}, {"TYPE_BF16", "0"}}) ==
        "#define KD_N 8\n#define KD_TYPE_BF16 0\n");
}

TEST_CASE("config_prelude fails on a value the header does not declare, naming it") {
  const std::string msg = error_of(kConfig, {{"N", "8"}, {"TYPE_BF16", "0"}, {"EXTRA", "2"}});
  CHECK(msg.find("KD_EXTRA") != std::string::npos);
  CHECK(msg.find("t_config.h") != std::string::npos);
}

TEST_CASE("config_prelude fails on a default the generator leaves in place, naming it") {
  const std::string msg = error_of(kConfig, {{"N", "8"}});
  CHECK(msg.find("KD_TYPE_BF16") != std::string::npos);
}

TEST_CASE("config_prelude fails on a malformed or repeated default") {
  CHECK(error_of("#ifndef KD_n\n", {}).find("t_config.h:1") != std::string::npos);
  CHECK(error_of("#ifndef KD_N\n#ifndef KD_N\n", {{"N", "1"}}).find("t_config.h:2") != std::string::npos);
}

TEST_CASE("flatten inlines the named headers and keeps every other line") {
  kdtree::codegen::KernelSource ks;
  ks.source = "#define KD_N 8\n#include \"a.h\"\n#include <other.h>\nint x;\n";
  ks.headers = {{"a.h", "int a;\n"}};
  CHECK(kdtree::codegen::flatten(ks) == "#define KD_N 8\nint a;\n#include <other.h>\nint x;\n");
}

TEST_CASE("flatten expands nested named headers once each") {
  kdtree::codegen::KernelSource ks;
  ks.source = "#include \"a.h\"\n#include \"b.h\"\nint x;\n";
  ks.headers = {{"a.h", "#include \"b.h\"\nint a;\n"}, {"b.h", "int b;\n"}};
  CHECK(kdtree::codegen::flatten(ks) == "int b;\nint a;\nint x;\n");
}

TEST_CASE("every embedded template is present") {
  auto names = kdtree::codegen::template_names();
  CHECK(names.size() >= 4);
  for (const auto& name : names) {
    INFO(name);
    std::string text = kdtree::codegen::template_text(name);
    CHECK(!text.empty());
    CHECK(text.find("${") == std::string::npos);  // no placeholders: every template is plain CUDA
  }
  CHECK_THROWS_AS(kdtree::codegen::template_text("no_such_template.cu"), kdtree::Error);
}
