// Every template is valid CUDA on its own: NVRTC checks each templates/<op>.cu
// with its config header's defaults (no generated values), the way an editor
// (clangd) or `nvcc -fdevice-syntax-only -I templates -I include` reads it.
// Front end only (-fdevice-syntax-only), so the whole check takes seconds.
#include <doctest/doctest.h>

#include <nvrtc.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/ops.hpp"
#include "codegen/render.hpp"
#include "codegen/template_store.hpp"

using namespace kdtree::codegen;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

const std::string kDeviceErrors = "kdtree/kdtree_device_errors.h";

}  // namespace

TEST_CASE("templates: every templates/<op>.cu compiles alone with its config defaults (NVRTC syntax check)") {
  // No prelude: the template text as an editor sees it, its includes resolved from
  // templates/ and include/ (as -I templates -I include would).
  const std::string errors = read_file(std::string(KDTREE_SOURCE_DIR) + "/include/" + kDeviceErrors);
  for (const std::string& op : operation_names()) {
    INFO("templates/" << op << ".cu");
    const std::string source = template_text(op + ".cu");
    const std::vector<std::string> names = {"common.cuh", kDeviceErrors, op + "_params.h", op + "_config.h"};
    std::vector<std::string> texts;
    for (const std::string& n : names) texts.push_back(n == kDeviceErrors ? errors : template_text(n));
    std::vector<const char*> name_ptrs, text_ptrs;
    for (size_t i = 0; i < names.size(); ++i) {
      name_ptrs.push_back(names[i].c_str());
      text_ptrs.push_back(texts[i].c_str());
    }
    nvrtcProgram program = nullptr;
    REQUIRE(nvrtcCreateProgram(&program, source.c_str(), (op + ".cu").c_str(), static_cast<int>(names.size()),
                               text_ptrs.data(), name_ptrs.data()) == NVRTC_SUCCESS);
    const char* options[] = {"--gpu-architecture=compute_120", "-std=c++17", "-fdevice-syntax-only"};
    const nvrtcResult result = nvrtcCompileProgram(program, 3, options);
    size_t log_size = 0;
    nvrtcGetProgramLogSize(program, &log_size);
    std::string log(log_size, '\0');
    if (log_size) nvrtcGetProgramLog(program, log.data());
    nvrtcDestroyProgram(&program);
    INFO(log);
    CHECK(result == NVRTC_SUCCESS);
    CHECK(log.find("warning") == std::string::npos);
  }
}

TEST_CASE("templates: the device error header NVRTC receives is kdtree.h's") {
  const std::string real = read_file(std::string(KDTREE_SOURCE_DIR) + "/include/" + kDeviceErrors);
  const std::string generated = device_errors_header();
  const std::regex name_re("KDTREE_DEVICE_ERROR_[A-Z_]+");
  std::set<std::string> real_names, generated_names;
  for (auto it = std::sregex_iterator(real.begin(), real.end(), name_re); it != std::sregex_iterator(); ++it)
    real_names.insert(it->str());
  for (auto it = std::sregex_iterator(generated.begin(), generated.end(), name_re); it != std::sregex_iterator(); ++it)
    generated_names.insert(it->str());
  CHECK(real_names.size() == 5);
  CHECK(real_names == generated_names);
}

TEST_CASE("templates: the config defaults are a shape the generator produces") {
  // verify_attention's defaults are MLA 576/512, W=64, page 64, bf16 with sm_120's
  // tiles; each generator's prelude for its default point must define the same values.
  for (const OpInfo& op : operations()) {
    INFO(op.name);
    OpPoint point;
    if (std::string(op.name) == "sample_tokens") point.dtype = KDTREE_DTYPE_BF16;
    const KernelSource ks = op.generate(point, arch_from_sm(120));
    const std::string config = template_text(std::string(op.name) + "_config.h");
    // Each "#define KD_X v" of the prelude appears in the header as "#define KD_X v  //".
    size_t at = 0;
    int defines = 0;
    while ((at = ks.source.find("#define KD_", at)) != std::string::npos) {
      const size_t end = ks.source.find('\n', at);
      const std::string line = ks.source.substr(at, end - at);
      INFO(line);
      CHECK(config.find(line + "  //") != std::string::npos);
      at = end;
      ++defines;
    }
    CHECK(defines > 0);
  }
}
