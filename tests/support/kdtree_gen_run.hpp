// Runs the built kdtree-gen for the tests in tests/tools: the tool next to the
// test binary in the build directory, or $KDTREE_GEN.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <doctest/doctest.h>

namespace kdtree::test {

inline std::filesystem::path kdtree_gen_path() {
  if (const char* env = std::getenv("KDTREE_GEN")) return env;
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kdtree-gen";
}

// The whole file ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct ToolRun {
  int status = -1;  // the exit status; -1 when killed by a signal
  std::string out, err;
};

// Runs "<prefix>'<kdtree-gen>' <args>" through the shell with stdout and stderr
// in <dir>/stdout and <dir>/stderr (left there, e.g. for a JSON check), and
// reads them back. prefix: what the tool runs under, e.g. "timeout 10 " or a
// setpriv command (ending in a space).
inline ToolRun run_kdtree_gen(const std::filesystem::path& dir, const std::string& args,
                              const std::string& prefix = "") {
  const std::filesystem::path tool = kdtree_gen_path();
  REQUIRE_MESSAGE(std::filesystem::exists(tool), "kdtree-gen not found at ", tool.string(),
                  " (build the kdtree-gen target, or set KDTREE_GEN)");
  const std::filesystem::path out = dir / "stdout", err = dir / "stderr";
  const std::string command =
      prefix + "'" + tool.string() + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int raw = std::system(command.c_str());
  ToolRun r;
  r.status = raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace kdtree::test
