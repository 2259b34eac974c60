// NVRTC: rendered CUDA source -> cubin for one arch.
#pragma once
#include <string>
#include <vector>

#include "codegen/arch.hpp"
#include "codegen/kernel_source.hpp"

namespace kdtree {

struct NvrtcOutput {
  std::vector<char> cubin;
  std::string log;  // includes the ptxas resource report (-v)
};

// Every option passed to NVRTC for `source` on `arch` (part of the cache key).
std::vector<std::string> nvrtc_options(const codegen::KernelSource& source, const codegen::Arch& arch);

// Throws KDTREE_ERROR_COMPILE carrying the log and options; the failing source is
// written to a file whose path the message names.
NvrtcOutput nvrtc_compile(const codegen::KernelSource& source, const codegen::Arch& arch);

}  // namespace kdtree
