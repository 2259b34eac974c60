#include "runtime/nvrtc_compiler.hpp"

#include <nvrtc.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/posix_io.hpp"
#include "codegen/render.hpp"

namespace kdtree {
namespace {

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) fail(KDTREE_ERROR_COMPILE, fmt::format("{}: {}", what, nvrtcGetErrorString(r)));
}

// The failing source goes to a new private file in $TMPDIR (else /tmp) with an
// unpredictable name: mkstemps creates it O_EXCL with mode 0600, so a planted
// file or symlink is never followed, truncated or read by others.
std::string write_failed_source(const codegen::KernelSource& source, const codegen::Arch& arch) {
  std::error_code ec;
  auto dir = std::filesystem::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  std::string path = (dir / fmt::format("kdtree-failed-{}-{}-XXXXXX.cu", source.file_stem, arch.name())).string();
  const int fd = ::mkstemps(path.data(), 3);
  if (fd < 0) {
    return fmt::format("(could not write the source to {}: {})", dir.string(), errno_text(errno));
  }
  const std::string text = codegen::flatten(source);
  const bool written = write_all(fd, text.data(), text.size());
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(path.c_str());
    return fmt::format("(could not write the source to {})", path);
  }
  return path;
}

}  // namespace

std::vector<std::string> nvrtc_options(const codegen::KernelSource& source, const codegen::Arch& arch) {
  std::vector<std::string> options = {
      "--gpu-architecture=" + arch.name() + (source.arch_specific ? "a" : ""), "-std=c++17",
      "--ptxas-options=-v",  // the resource report: registers, shared memory, spills
  };
  options.insert(options.end(), source.options.begin(), source.options.end());
  return options;
}

NvrtcOutput nvrtc_compile(const codegen::KernelSource& source, const codegen::Arch& arch) {
  nvrtcProgram program = nullptr;
  std::vector<const char*> header_texts, header_names;
  for (const auto& [name, text] : source.headers) {
    header_names.push_back(name.c_str());
    header_texts.push_back(text.c_str());
  }
  check_nvrtc(nvrtcCreateProgram(&program, source.source.c_str(), (source.file_stem + ".cu").c_str(),
                                 static_cast<int>(header_texts.size()), header_texts.data(), header_names.data()),
              "nvrtcCreateProgram");
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&program};

  std::vector<std::string> options = nvrtc_options(source, arch);
  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());
  nvrtcResult compiled = nvrtcCompileProgram(program, static_cast<int>(argv.size()), argv.data());

  NvrtcOutput out;
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  out.log.resize(log_size);
  if (log_size > 0) nvrtcGetProgramLog(program, out.log.data());
  while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();

  if (compiled != NVRTC_SUCCESS) {
    std::string path = write_failed_source(source, arch);
    fail(KDTREE_ERROR_COMPILE,
         fmt::format("NVRTC failed to compile {} for {}: {}\noptions: {}\nsource: {}\nlog:\n{}", source.label,
                     arch.name(), nvrtcGetErrorString(compiled), fmt::join(options, " "), path, out.log));
  }
  size_t cubin_size = 0;
  check_nvrtc(nvrtcGetCUBINSize(program, &cubin_size), "nvrtcGetCUBINSize");
  out.cubin.resize(cubin_size);
  check_nvrtc(nvrtcGetCUBIN(program, out.cubin.data()), "nvrtcGetCUBIN");
  return out;
}

}  // namespace kdtree
