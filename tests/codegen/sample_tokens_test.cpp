// sample_tokens generator: names, validation and the rendered source. (NVRTC
// compiles it for sm_90 and sm_120 in tests/runtime/kernel_grid_compile_test.cpp.)
#include <doctest/doctest.h>

#include <string>

#include "base/error.hpp"
#include "codegen/render.hpp"
#include "codegen/sample_tokens.hpp"
#include "tests/support/codegen_checks.hpp"

using namespace kdtree::codegen;
using kdtree::test::validation_error;

TEST_CASE("sample_tokens spec: names") {
  SampleSpec spec;
  CHECK(spec.label() == "sample_tokens[bf16]");
  const KernelSource bf16 = generate_sample_tokens(spec, arch_from_sm(120));
  CHECK(bf16.op == "sample_tokens");
  CHECK(bf16.label == "sample_tokens[bf16]");
  CHECK(bf16.file_stem == "sample_tokens-bf16");
  spec.logits_dtype = KDTREE_DTYPE_F32;
  CHECK(spec.label() == "sample_tokens[f32]");
  CHECK(generate_sample_tokens(spec, arch_from_sm(90)).file_stem == "sample_tokens-f32");
  CHECK(spec.fast_key() != SampleSpec{}.fast_key());
}

TEST_CASE("sample_tokens spec: only BF16 and F32 logits") {
  SampleSpec spec;
  kdtree_status status = KDTREE_OK;
  spec.logits_dtype = KDTREE_DTYPE_F16;
  std::string msg = validation_error(spec, &status);
  CHECK(status == KDTREE_ERROR_UNSUPPORTED);
  CHECK(msg.find("f16") != std::string::npos);
  CHECK(msg.find("BF16 or F32") != std::string::npos);
  // 3 is no enumerator but inside the enum's value range (0..3); 9 would be UB to
  // even form. Raw C values are checked at the C ABI (tests/runtime/*_args_test.cpp).
  spec.logits_dtype = static_cast<kdtree_dtype>(3);
  CHECK(validation_error(spec, &status).find("BF16 or F32") != std::string::npos);
  CHECK(status == KDTREE_ERROR_UNSUPPORTED);
  CHECK_THROWS_AS(generate_sample_tokens(spec, arch_from_sm(120)), kdtree::Error);
}

TEST_CASE("sample_tokens source: one self-contained translation unit per dtype") {
  for (kdtree_dtype dtype : {KDTREE_DTYPE_BF16, KDTREE_DTYPE_F32}) {
    SampleSpec spec;
    spec.logits_dtype = dtype;
    const KernelSource s = generate_sample_tokens(spec, arch_from_sm(120));
    INFO(s.label);
    CHECK(s.entry_points == std::vector<std::string>{"kdtree_sample_tokens"});
    const std::string flat = flatten(s);
    CHECK(flat.find("typedef struct kdtree_sample_tokens_params") != std::string::npos);
    CHECK(flat.find("extern \"C\" __global__") != std::string::npos);
    CHECK(flat.find("#include \"") == std::string::npos);
    const std::string flag = std::string("#define KD_LOGITS_BF16 ") + (dtype == KDTREE_DTYPE_BF16 ? "1" : "0");
    CHECK(s.source.find(flag) != std::string::npos);
    CHECK(s.source.find("#define KD_THREADS " + std::to_string(kSampleThreads)) != std::string::npos);
  }
}
