// Turning a template into the translation unit NVRTC compiles. Every template
// templates/<op>.cu is valid CUDA on its own: it includes common.cuh, its
// <op>_params.h and its <op>_config.h, whose #ifndef defaults let tools read it.
// The generator puts a prelude before it that defines each KD_<NAME>
// configuration value, and hands the headers to NVRTC as named headers.
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/kernel_source.hpp"

namespace kdtree::codegen {

using Params = std::map<std::string, std::string>;

// "#define KD_<NAME> <value>" for each value. The config header (`config_name`,
// text `config`) must give a default (#ifndef KD_<NAME>) for exactly these names:
// a value it lacks, or a default no value replaces, throws KDTREE_ERROR_INTERNAL
// naming both, so a template and its generator cannot drift apart silently.
std::string config_prelude(std::string_view config_name, std::string_view config, const Params& params);

// Sets ks.source (the config prelude, then templates/<name>.cu) and ks.headers
// (common.cuh, kdtree/kdtree_device_errors.h as embedded from include/,
// <name>_config.h and `headers`:
// by default <name>_params.h; templates sharing device code name their shared
// headers here).
void set_template_source(KernelSource& ks, const std::string& name, const Params& params,
                         const std::vector<std::string>& headers = {});

// ks.source with each #include of a named header replaced by the header's text,
// recursively and once per header: one self-contained file (`kdtree-gen emit`).
std::string flatten(const KernelSource& ks);

}  // namespace kdtree::codegen
