// Every template is valid CUDA on its own: NVRTC checks each templates/<op>.cu
// with its config header's defaults (no generated values), the way an editor
// (clangd) or `nvcc -fdevice-syntax-only -I templates -I include` reads it.
// Front end only (-fdevice-syntax-only), so the whole check takes seconds.
#include <doctest/doctest.h>

#include <nvrtc.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/ops.hpp"
#include "codegen/render.hpp"
#include "codegen/template_store.hpp"
#include "codegen/verify_attention.hpp"

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

TEST_CASE("templates: every templates/*.cu compiles alone with its config defaults (NVRTC syntax check)") {
  // No prelude: the template text as an editor sees it, its includes resolved from
  // templates/ and include/ (as -I templates -I include would).
  const std::string errors = read_file(std::string(KDTREE_SOURCE_DIR) + "/include/" + kDeviceErrors);
  std::vector<std::string> names = {kDeviceErrors}, texts = {errors}, kernels;
  for (const std::string& n : template_names()) {
    if (n.size() > 3 && n.compare(n.size() - 3, 3, ".cu") == 0) {
      kernels.push_back(n);
    } else {
      names.push_back(n);
      texts.push_back(template_text(n));
    }
  }
  std::vector<const char*> name_ptrs, text_ptrs;
  for (size_t i = 0; i < names.size(); ++i) {
    name_ptrs.push_back(names[i].c_str());
    text_ptrs.push_back(texts[i].c_str());
  }
  CHECK(kernels.size() > operation_names().size());  // every op's template, and verify_attention_qsplit.cu
  for (const std::string& name : kernels) {
    INFO("templates/" << name);
    const std::string source = template_text(name);
    nvrtcProgram program = nullptr;
    REQUIRE(nvrtcCreateProgram(&program, source.c_str(), name.c_str(), static_cast<int>(names.size()), text_ptrs.data(),
                               name_ptrs.data()) == NVRTC_SUCCESS);
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

TEST_CASE("templates: the device error header NVRTC receives is kdtree.h's, byte for byte") {
  const std::string real = read_file(std::string(KDTREE_SOURCE_DIR) + "/include/" + kDeviceErrors);
  CHECK(template_text(kDeviceErrors) == real);
  const KernelSource ks =
      generate_verify_attention(validate_verify_spec({576, 512, 16, 1, 64, 64, KDTREE_DTYPE_BF16}), arch_from_sm(120));
  const auto header =
      std::find_if(ks.headers.begin(), ks.headers.end(), [](const auto& h) { return h.first == kDeviceErrors; });
  REQUIRE(header != ks.headers.end());
  CHECK(header->second == real);
}

TEST_CASE("templates: the config defaults are a shape the generator produces") {
  // Each config header's defaults are one generated point's prelude: verify_attention
  // (flash) is sm_80's MLA 576/512, W=64, page 64, bf16; verify_attention_qsplit
  // sm_120's; verify_attention_wgmma sm_90's (and _e4m3 its e4m3 cache point,
  // _gqa its gqa128 point); the tree ops' any arch's default point.
  std::set<std::string> checked;
  auto check_prelude = [&](const KernelSource& ks, const std::string& what) {
    const auto config = std::find_if(ks.headers.begin(), ks.headers.end(), [](const auto& h) {
      return h.first.size() > 9 && h.first.compare(h.first.size() - 9, 9, "_config.h") == 0;
    });
    REQUIRE(config != ks.headers.end());
    INFO(what << ": " << config->first);
    // Each "#define KD_X v" of the prelude appears in the header as "#define KD_X v  //".
    size_t at = 0;
    int defines = 0, found = 0;
    while ((at = ks.source.find("#define KD_", at)) != std::string::npos) {
      const size_t end = ks.source.find('\n', at);
      found += config->second.find(ks.source.substr(at, end - at) + "  //") != std::string::npos;
      at = end;
      ++defines;
    }
    CHECK(defines > 0);
    if (found == defines) checked.insert(config->first);
  };
  for (int sm : {120, 90, 80}) {
    for (const OpInfo& op : operations()) {
      for (kdtree_kv_dtype kv : {KDTREE_KV_DTYPE_AS_Q, KDTREE_KV_DTYPE_E4M3}) {
        if (kv == KDTREE_KV_DTYPE_E4M3 && (sm != 90 || std::string(op.name) != "verify_attention")) continue;
        OpPoint point;
        point.kv_dtype = kv;  // e4m3: sm_90's verify_attention_wgmma_e4m3
        if (std::string(op.name) == "sample_tokens") point.dtype = KDTREE_DTYPE_BF16;
        check_prelude(op.generate(point, arch_from_sm(sm)), std::string(op.name) + " sm_" + std::to_string(sm));
      }
    }
  }
  const VerifySpec gqa128 = validate_verify_spec({128, 128, 8, 1, 64, 64, KDTREE_DTYPE_BF16});
  check_prelude(
      generate_verify_attention(gqa128, arch_from_sm(90), parse_verify_tiles("kernel=wgmma", gqa128, arch_from_sm(90))),
      "verify_attention gqa128 sm_90 kernel=wgmma");
  for (const std::string& n : template_names()) {
    if (n.size() > 9 && n.compare(n.size() - 9, 9, "_config.h") == 0) CHECK_MESSAGE(checked.count(n), n);
  }
}
