// The backend factory: names to backends. Links down to both backend libraries (or the CUDA stand-in).
#include "engine/session/backends.h"

#include <cstdlib>

#include "engine/cpu/backend_cpu.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/core/error.h"

namespace ds {

BackendChoice parse_backend_choice(const std::string& s) {
  if (s == "auto") return BackendChoice::Auto;
  if (s == "cpu") return BackendChoice::Cpu;
  if (s == "cuda") return BackendChoice::Cuda;
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() <= 8 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos)
    return {BackendChoice::Kind::Cuda, std::stoi(s.substr(5))};
  throw Error("unknown backend '" + s + "' (use cpu, cuda, cuda:N for GPU N, or auto)");
}

std::vector<BackendChoice> parse_backend_list(const std::string& s) {
  std::vector<BackendChoice> out;
  if (s == "cuda:all") {
    const int n = cuda_device_count();
    if (n == 0) {
      std::string why;
      cuda_backend_available(&why, 0);
      throw Error("--backend cuda:all: no usable CUDA device (" + why + ")");
    }
    for (int d = 0; d < n; ++d) out.push_back({BackendChoice::Kind::Cuda, d});
    return out;
  }
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty()) throw Error("--backend '" + s + "': an empty entry in the list");
    const bool bare = item.find_first_not_of("0123456789") == std::string::npos && item.size() <= 3;
    if (bare) {
      if (out.empty() || out.back().kind != BackendChoice::Kind::Cuda)
        throw Error("--backend '" + s + "': '" + item + "' follows no CUDA entry (cuda:0,1 lists GPUs 0 and 1)");
      out.push_back({BackendChoice::Kind::Cuda, std::stoi(item)});
    } else {
      out.push_back(parse_backend_choice(item));
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (out.size() > 1)
    for (const BackendChoice& c : out)
      if (c.kind == BackendChoice::Kind::Auto) throw Error("--backend '" + s + "': auto cannot be one of several");
  return out;
}

int64_t parse_size(const std::string& s, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double unit = 1;
  std::string rest = end ? std::string(end) : std::string();
  if (rest == "K" || rest == "k" || rest == "KiB") unit = 1024.0;
  else if (rest == "M" || rest == "MiB") unit = 1024.0 * 1024;
  else if (rest == "G" || rest == "GiB") unit = 1024.0 * 1024 * 1024;
  else if (rest == "T" || rest == "TiB") unit = 1024.0 * 1024 * 1024 * 1024;
  else if (!rest.empty()) unit = 0;
  const double bytes = v * unit;
  if (s.empty() || end == s.c_str() || unit == 0 || !(bytes >= double(1 << 20)) || bytes > 9e18)
    throw Error(flag + ": '" + s + "' is not a size of at least 1M (bytes, or a number with K, M, G or T: 20G)");
  return int64_t(bytes);
}

std::string backend_list_text(const std::vector<BackendChoice>& list) {
  std::string t;
  for (size_t i = 0; i < list.size(); ++i) {
    const BackendChoice& c = list[i];
    t += i ? "," : "";
    const bool more_gpus = i > 0 && c.kind == BackendChoice::Kind::Cuda && list[i - 1].kind == BackendChoice::Kind::Cuda;
    t += c.kind == BackendChoice::Kind::Cpu ? "cpu"
         : c.kind == BackendChoice::Kind::Auto ? "auto"
         : (more_gpus ? "" : "cuda:") + std::to_string(c.device);  // cuda:0,1 as --backend takes it
  }
  return t;
}

std::unique_ptr<Backend> make_backend(BackendChoice choice, int cpu_threads) {
  std::string why;
  if (choice.kind == BackendChoice::Kind::Cuda ||
      (choice.kind == BackendChoice::Kind::Auto && cuda_backend_available(&why, choice.device)))
    return make_cuda_backend(choice.device);
  return make_cpu_backend(cpu_threads);
}

}  // namespace ds
