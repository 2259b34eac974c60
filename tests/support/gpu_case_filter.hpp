// `kdtree_gpu_tests --case NAME`: runs only the grid points whose name
// (verify_label: "verify_attention[mla576/512,W=64,page=64,bf16,Hq=16,B=3]")
// matches NAME, where '*' matches any run of characters. Grid tests ask
// case_selected() per point; gpu_main fails the run when a filter matched none.
#pragma once
#include <string>

namespace kdtree::test {

inline std::string& case_filter() {
  static std::string filter;  // empty: every point
  return filter;
}

inline int& cases_selected() {
  static int n = 0;
  return n;
}

// Glob match with '*' only: names hold '[', ',' and '=' that doctest's own
// filters treat as syntax.
inline bool glob_match(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') return glob_match(pattern + 1, text) || (*text && glob_match(pattern, text + 1));
  return *text == *pattern && glob_match(pattern + 1, text + 1);
}

inline bool case_selected(const std::string& name) {
  const bool selected = case_filter().empty() || glob_match(case_filter().c_str(), name.c_str());
  cases_selected() += selected;
  return selected;
}

}  // namespace kdtree::test
