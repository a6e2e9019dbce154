#include "engine/core/input_limits.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/core/error.h"

namespace ds {

nlohmann::json parse_json(std::string_view text, const std::string& what, int max_depth) {
  const nlohmann::json::parser_callback_t limit = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > max_depth)
      throw Error((what.empty() ? "" : what + ": ") + "JSON nested deeper than " + std::to_string(max_depth) +
                  " levels");
    return true;
  };
  return nlohmann::json::parse(text.begin(), text.end(), limit);
}

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  if (bytes >= (uint64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.1f GB", double(bytes) / double(1 << 30));
  else if (bytes >= (uint64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / double(1 << 20));
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%.1f KB", double(bytes) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)bytes);
  return buf;
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

uint64_t free_disk_bytes(const std::string& path) {
  struct statvfs v {};
  std::string p = path;
  if (::statvfs(p.c_str(), &v) != 0) {
    const size_t slash = p.find_last_of('/');
    p = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
    if (::statvfs(p.c_str(), &v) != 0) return 0;
  }
  return uint64_t(v.f_bavail) * uint64_t(v.f_frsize);
}

namespace {
struct stat stat_regular(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail_file(path, "cannot open the " + what + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail_file(path, "is a directory, not a " + what);
  if (!S_ISREG(st.st_mode))
    fail_file(path, "is not a regular file (a FIFO, device or socket): refusing to read it as a " + what);
  return st;
}
}  // namespace

void check_regular_file(const std::string& path, const std::string& what) {
  stat_regular(path, what);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_file(path, "cannot open the " + what + " (is it readable?)");
}

std::string read_text_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  const struct stat st = stat_regular(path, what);
  auto too_big = [&](uint64_t size) {
    fail_file(path, "the " + what + " is " + format_bytes(size) + ", more than the " + format_bytes(max_bytes) +
                        " this tool reads for it");
  };
  if (uint64_t(st.st_size) > max_bytes) too_big(uint64_t(st.st_size));
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_file(path, "cannot open the " + what + " (is it readable?)");
  std::string out;
  out.resize(size_t(std::min<uint64_t>(max_bytes + 1, uint64_t(st.st_size) + 1)));
  size_t got = 0;
  for (;;) {  // the file may have grown since stat: read to the limit + 1, never further
    if (got == out.size()) {
      if (out.size() > max_bytes) break;
      out.resize(size_t(std::min<uint64_t>(max_bytes + 1, uint64_t(out.size()) * 2 + 4096)));
    }
    f.read(out.data() + got, std::streamsize(out.size() - got));
    const std::streamsize r = f.gcount();
    got += size_t(r);
    if (r == 0 || !f) break;
  }
  if (f.bad()) fail_file(path, "error while reading the " + what);
  if (got > max_bytes) too_big(got);
  out.resize(got);
  return out;
}

std::string read_prompt_file(const std::string& path) {
  std::string text = read_text_file(path, kMaxPromptFileBytes, "prompt file");
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  return text;
}

std::string read_token_ids_file(const std::string& path) {
  return read_text_file(path, kMaxPromptFileBytes, "token ids file");
}

}  // namespace ds
