// Shared helpers for the tests: fixture paths, expected tensors, error measures, temporary folders.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/core/error.h"

#include "engine/core/safetensors.h"

namespace dstest {

inline std::string source_dir() {
  const char* e = std::getenv("DS_SOURCE_DIR");
  return e ? e : DS_SOURCE_DIR;
}
inline std::string binary_dir() {
  const char* e = std::getenv("DS_BINARY_DIR");
  return e ? e : DS_BINARY_DIR;
}
inline std::string fixture(const std::string& name) { return source_dir() + "/tests/fixtures/" + name; }
// The message of the ds::Error f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

inline std::vector<std::string> all_fixtures() {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(source_dir() + "/tests/fixtures"))
    if (std::filesystem::exists(e.path() / "expected.safetensors")) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// A fixture's expected.safetensors, written by transformers (tests/gen_fixtures.py).
struct Expected {
  std::unique_ptr<ds::SafetensorsFile> f;
  explicit Expected(const std::string& dir) : f(std::make_unique<ds::SafetensorsFile>(dir + "/expected.safetensors")) {}
  bool has(const std::string& n) const { return f->find(n) != nullptr; }
  std::vector<float> get(const std::string& n) const {
    const ds::TensorInfo* t = f->find(n);
    EXPECT_NE(t, nullptr) << n;
    return t ? ds::tensor_to_f32(*t) : std::vector<float>{};
  }
  std::vector<int32_t> ids() const {
    std::vector<float> v = get("input_ids");
    return std::vector<int32_t>(v.begin(), v.end());
  }
};

// ||a - b|| / ||b||: the error measure the fixtures are held to.
inline double rel_err(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * b[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}
inline double max_abs_err(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// A fresh temporary folder, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("diffscope-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Run a command, capturing stderr+stdout; returns the exit code.
inline int run_cmd(const std::string& cmd, std::string* output) {
  const std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  std::string out;
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, k);
  const int st = pclose(p);
  if (output) *output = out;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

inline std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void write_file(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

}  // namespace dstest
