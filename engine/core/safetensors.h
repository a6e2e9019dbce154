// safetensors reading: a memory-mapped file whose header is validated before any tensor is touched, and
// checkpoints made of one file or of shards listed by model.safetensors.index.json.
//
// Format (https://github.com/huggingface/safetensors, README "Format"): u64 little-endian header length N, N bytes of UTF-8 JSON, then the data. Each header
// entry is name -> {dtype, shape, data_offsets:[begin,end)} relative to the data start. We check: N fits in the
// file, the JSON parses and is an object, every dtype is known, shape x dtype size == end - begin, spans lie
// inside the file and do not overlap. Nothing a file carries is ever executed (no pickle support at all).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace ds {

// Read-only mapping of a whole file; one owner, unmapped in the destructor.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws ds::Error naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::Unknown;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping of `file`
  size_t nbytes = 0;
  std::string file;               // path of the file that holds it, for messages
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::string shape_str() const;  // "[4, 128]"
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates; throws ds::Error
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A whole checkpoint: DIR/model.safetensors, DIR/model.safetensors.index.json with its shards, or one file.
// Refuses pickles (.bin/.pt/.pth) with a message saying how to convert them.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws "…: missing tensor NAME"
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }
  size_t total_bytes() const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
};

// Copy a tensor into f32 (converting F16/BF16/F64). Reading goes through a guard so that a file truncated
// under the mapping gives ds::Error instead of SIGBUS.
void tensor_to_f32(const TensorInfo& t, float* out);
std::vector<float> tensor_to_f32(const TensorInfo& t);
// Raw copy of the bytes with the same guard.
void guarded_copy(const TensorInfo& t, void* dst, size_t offset, size_t nbytes);

// Write a safetensors file (the CLI's --dump, tools, tests). Tensors are written in the order given.
struct TensorOut {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ds
