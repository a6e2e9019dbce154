// The one way the tools write a file (reports, CSVs, plots, dumps, statistics, benchmark JSON, exports, settings):
//   - into a temporary beside the target with a name no other writer uses, renamed over the target only once every
//     byte is written and flushed, so an interrupted or failed write (a full disk) leaves the previous file whole;
//   - a target that is a symlink has its target replaced (the link stays a link);
//   - a target that exists and is not a regular file (a directory, FIFO, device or socket) is refused, and so is a
//     target that is one of the inputs (the corpus a scan reads, a prompt file, a file of an open model's folder),
//     however it is spelled;
//   - an existing target keeps its mode (and its owner, where the process may set it);
//   - every error (open, write, flush, rename) is a ds::Error naming the file.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace ds {

class SafeWriter {
 public:
  // what: what the file is, for messages ("the report"); inputs: files this target must not be.
  SafeWriter(const std::string& path, const std::string& what, const std::vector<std::string>& inputs = {});
  ~SafeWriter();  // without commit(): the temporary is removed and the target left as it was
  SafeWriter(const SafeWriter&) = delete;
  SafeWriter& operator=(const SafeWriter&) = delete;
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();
  const std::string& target() const { return target_; }  // the file that is replaced (a symlink's target)

 private:
  [[noreturn]] void fail(const std::string& why);
  std::string path_, what_, target_, tmp_;
  int fd_ = -1;
  bool existed_ = false;
  unsigned mode_ = 0, uid_ = 0, gid_ = 0;
};

// Every file of this folder (a model's checkpoint folder, registered by Session::open) is an input of every write
// from now on: an existing file there, however it is spelled (its path's folder or, for a symlink, its target's), is
// refused as a target. New files may still be written there.
void protect_input_folder(const std::string& dir);

// SafeWriter in one call.
void write_file_safely(const std::string& path, const std::string& content, const std::string& what,
                       const std::vector<std::string>& inputs = {});

// Checks, before long work starts, that path could be written by SafeWriter (the same refusals); creates nothing.
void check_writable_target(const std::string& path, const std::string& what, const std::vector<std::string>& inputs = {});

}  // namespace ds
