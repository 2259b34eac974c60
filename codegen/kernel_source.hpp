// What a generator produces: one CUDA translation unit, ready for NVRTC.
#pragma once
#include <string>
#include <vector>

namespace kdtree::codegen {

struct KernelSource {
  std::string op;                        // "verify_attention", "tree_build", ...
  std::string label;                     // grid-point name: "verify_attention[mla576/512,W=64,page=64,bf16]"
  std::string file_stem;                 // file-name-safe: "verify_attention-mla576x512-W64-p64-bf16"
  std::string source;                    // rendered CUDA C++
  std::vector<std::string> entry_points; // extern "C" __global__ names
  std::vector<std::string> options;      // NVRTC options except the arch
};

}  // namespace kdtree::codegen
