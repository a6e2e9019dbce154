#include "engine/core/safe_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "engine/core/error.h"

namespace ds {
namespace fs = std::filesystem;

namespace {

// protect_input_folder's folders: (device, inode) and the path given, for messages.
struct Protected {
  dev_t dev;
  ino_t ino;
  std::string path;
};
std::mutex g_protected_mu;
std::vector<Protected> g_protected;

// The protected folder `file` lies in (by its folder's device and inode), or nullptr.
const Protected* protected_folder_of(const std::string& file) {
  const fs::path dir = fs::path(file).parent_path().empty() ? fs::path(".") : fs::path(file).parent_path();
  struct stat sd {};
  if (::stat(dir.c_str(), &sd) != 0) return nullptr;
  for (const Protected& p : g_protected)
    if (p.dev == sd.st_dev && p.ino == sd.st_ino) return &p;
  return nullptr;
}

// The file a write to `path` replaces: path itself, or where its chain of symlinks ends.
std::string resolve_target(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
  std::error_code ec;
  const fs::path t = fs::weakly_canonical(fs::path(path), ec);
  if (ec) fail_file(path, "cannot follow the symbolic link: " + ec.message());
  return t.string();
}

// The checks of SafeWriter, on the resolved target. Fills st of an existing target; returns whether it exists.
bool check_target(const std::string& path, const std::string& target, const std::string& what,
                  const std::vector<std::string>& inputs, struct stat& st) {
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) fail_file(path, "is a directory: cannot write " + what + " there");
  if (exists && !S_ISREG(st.st_mode))
    fail_file(path, "is not a regular file (a FIFO, device or socket): refusing to replace it with " + what);
  for (const std::string& in : inputs) {
    struct stat si {};
    if (in.empty() || ::stat(in.c_str(), &si) != 0) continue;
    if (exists && si.st_dev == st.st_dev && si.st_ino == st.st_ino)
      fail_file(path, "is the input " + in + ": refusing to overwrite it with " + what);
  }
  if (exists) {  // a file of an open model's folder (as named, or where its symlink points: a Hugging Face cache)
    std::lock_guard lk(g_protected_mu);
    const Protected* p = protected_folder_of(path);
    if (!p) p = protected_folder_of(target);
    if (p) fail_file(path, "is a file of the model folder " + p->path + ": refusing to overwrite it with " + what);
  }
  const fs::path dir = fs::path(target).parent_path().empty() ? fs::path(".") : fs::path(target).parent_path();
  struct stat sd {};
  if (::stat(dir.c_str(), &sd) != 0 || !S_ISDIR(sd.st_mode))
    fail_file(path, "cannot write " + what + ": the folder " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    fail_file(path, "cannot write " + what + ": the folder " + dir.string() + " is not writable");
  return exists;
}

}  // namespace

void protect_input_folder(const std::string& dir) {
  struct stat sd {};
  if (::stat(dir.c_str(), &sd) != 0 || !S_ISDIR(sd.st_mode)) return;
  std::lock_guard lk(g_protected_mu);
  for (const Protected& p : g_protected)
    if (p.dev == sd.st_dev && p.ino == sd.st_ino) return;
  g_protected.push_back({sd.st_dev, sd.st_ino, dir});
}

void check_writable_target(const std::string& path, const std::string& what, const std::vector<std::string>& inputs) {
  struct stat st {};
  check_target(path, resolve_target(path), what, inputs, st);
}

SafeWriter::SafeWriter(const std::string& path, const std::string& what, const std::vector<std::string>& inputs)
    : path_(path), what_(what) {
  target_ = resolve_target(path);
  struct stat st {};
  existed_ = check_target(path, target_, what, inputs, st);
  if (existed_) mode_ = unsigned(st.st_mode & 07777), uid_ = unsigned(st.st_uid), gid_ = unsigned(st.st_gid);
  // A name no other writer picks: the target's, hidden, with the process id, a counter and the clock.
  static std::atomic<unsigned> counter{0};
  const fs::path t(target_);
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    const auto tick = std::chrono::steady_clock::now().time_since_epoch().count();
    tmp_ = (t.parent_path() / ("." + t.filename().string() + "." + std::to_string(::getpid()) + "." +
                               std::to_string(counter++) + "." + std::to_string(tick % 1000000) + ".partial"))
               .string();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) fail("cannot create a temporary file beside it: " + std::string(std::strerror(errno)));
  }
  if (fd_ < 0) fail("cannot create a temporary file beside it");
}

SafeWriter::~SafeWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void SafeWriter::fail(const std::string& why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  fail_file(path_, "cannot write " + what_ + ": " + why);
}

void SafeWriter::write(const void* data, size_t n) {
  if (fd_ < 0) fail("the file is already closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(w < 0 ? std::strerror(errno) : "nothing written");
    p += w;
    n -= size_t(w);
  }
}

void SafeWriter::commit() {
  if (fd_ < 0) fail("the file is already closed");
  if (existed_) {
    if (::fchown(fd_, uid_t(uid_), gid_t(gid_)) != 0) {
      // Not allowed to give it the old owner: it stays ours, as any new file would.
    }
    if (::fchmod(fd_, mode_t(mode_)) != 0) fail(std::string("cannot keep its mode: ") + std::strerror(errno));
  }
  if (::fsync(fd_) != 0 && errno != EINVAL) fail(std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(std::strerror(errno));
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail(std::strerror(errno));
  tmp_.clear();
}

void write_file_safely(const std::string& path, const std::string& content, const std::string& what,
                       const std::vector<std::string>& inputs) {
  SafeWriter w(path, what, inputs);
  w.write(content);
  w.commit();
}

}  // namespace ds
