#include <doctest/doctest.h>

#include <string>

#include "codegen/render.hpp"
#include "codegen/template_store.hpp"
#include "base/error.hpp"

using kdtree::codegen::render;

namespace {
std::string error_of(const std::string& text, const kdtree::codegen::Params& params) {
  try {
    render("t.cu", text, params);
  } catch (const kdtree::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("render substitutes named placeholders") {
  CHECK(render("t.cu", "int a[${N}]; // ${N} of ${TYPE}\n", {{"N", "4"}, {"TYPE", "float"}}) ==
        "int a[4]; // 4 of float\n");
  // A lone $ or braces of CUDA code are left alone.
  CHECK(render("t.cu", "if (x) { y = $z; }", {}) == "if (x) { y = $z; }");
}

TEST_CASE("render fails on an unknown placeholder - naming it and its line") {
  std::string msg = error_of("line1\nint a = ${MISSING};\n", {});
  CHECK(msg.find("MISSING") != std::string::npos);
  CHECK(msg.find("t.cu:2") != std::string::npos);
}

TEST_CASE("render fails on an unused value") {
  std::string msg = error_of("int a = ${A};", {{"A", "1"}, {"EXTRA", "2"}});
  CHECK(msg.find("EXTRA") != std::string::npos);
  CHECK(msg.find("not used") != std::string::npos);
}

TEST_CASE("render fails on a malformed placeholder") {
  CHECK(error_of("int a = ${lower};", {{"lower", "1"}}).find("malformed") != std::string::npos);
  CHECK(error_of("int a = ${UNCLOSED;", {}).find("malformed") != std::string::npos);
}

TEST_CASE("every embedded template is present and placeholder-clean") {
  auto names = kdtree::codegen::template_names();
  CHECK(names.size() >= 4);
  for (const auto& name : names) {
    INFO(name);
    std::string text = kdtree::codegen::template_text(name);
    CHECK(!text.empty());
    CHECK(text.find("{{") == std::string::npos);  // no doubled braces
  }
  CHECK_THROWS_AS(kdtree::codegen::template_text("no_such_template.cu"), kdtree::Error);
}
