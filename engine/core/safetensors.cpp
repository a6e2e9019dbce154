// safetensors reader/writer. See safetensors.h for the checks; every failure names the file.
#include "engine/core/safetensors.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/input_limits.h"
#include "engine/core/safe_write.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ds {

// ---------------------------------------------------------------------------------------------------------------
// Guarded reads. A file that shrinks after it was mapped turns reads past its new end into SIGBUS. Reads of
// tensor data go through guarded_copy(), which catches that signal on this thread and turns it into ds::Error.
namespace {
// volatile + signal fences: the stores around the copy must not be merged or moved by the compiler.
thread_local sigjmp_buf* volatile t_guard = nullptr;
struct sigaction g_prev_bus;

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (t_guard) siglongjmp(*t_guard, 1);
  // Not ours: hand over to whatever was installed before (default: terminate).
  if (g_prev_bus.sa_flags & SA_SIGINFO) {
    g_prev_bus.sa_sigaction(sig, info, ctx);
  } else if (g_prev_bus.sa_handler != SIG_IGN && g_prev_bus.sa_handler != SIG_DFL) {
    g_prev_bus.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void install_sigbus_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_prev_bus);
  });
}

// Copies with SIGBUS turned into a return value. Kept free of C++ objects with destructors between
// sigsetjmp and the copy, so the longjmp skips nothing.
bool copy_guarded(void* dst, const void* src, size_t n) {
  install_sigbus_guard();
  sigjmp_buf buf;
  sigjmp_buf* volatile prev = t_guard;
  if (sigsetjmp(buf, 1) != 0) {
    t_guard = prev;
    return false;
  }
  t_guard = &buf;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = prev;
  return true;
}
}  // namespace

void guarded_copy(const TensorInfo& t, void* dst, size_t offset, size_t nbytes) {
  if (offset + nbytes > t.nbytes) throw Error(t.file + ": read past the end of tensor " + t.name);
  if (!copy_guarded(dst, t.data + offset, nbytes))
    fail_file(t.file, "the file changed or was truncated while it was being read (tensor " + t.name + ")");
}

// ---------------------------------------------------------------------------------------------------------------
MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_file(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_file(path, "not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail_file(path, std::string("cannot map: ") + std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------------------------
SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const size_t size = file_.size();
  if (size < 8) fail_file(path, "truncated: " + std::to_string(size) + " bytes, too short for a safetensors header");
  uint8_t lenbuf[8];
  TensorInfo whole{"header", DType::U8, {8}, file_.data(), 8, path};
  guarded_copy(whole, lenbuf, 0, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | lenbuf[i];
  if (n > size - 8)
    fail_file(path, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) +
                        " bytes): truncated or not a safetensors file");
  if (n > (100u << 20)) fail_file(path, "header of " + std::to_string(n) + " bytes is larger than the 100 MB limit");
  std::string header(n, '\0');
  TensorInfo hdr{"header", DType::U8, {int64_t(n)}, file_.data() + 8, size_t(n), path};
  guarded_copy(hdr, header.data(), 0, n);

  json j;
  try {
    j = parse_json(header, path + ": header");
  } catch (const json::exception& e) {
    fail_file(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail_file(path, "header is not a JSON object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  struct Span {
    uint64_t b, e;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail_file(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail_file(path, "__metadata__ value of " + m.key() + " is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail_file(path, "tensor " + name + ": " + what); };
    if (!v.is_object()) bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing dtype");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("missing shape");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) bad("missing data_offsets");
    TensorInfo t;
    t.name = name;
    t.file = path;
    const std::string dt = v["dtype"].get<std::string>();
    t.dtype = dtype_from_string(dt);
    if (t.dtype == DType::Unknown) bad("unknown dtype '" + dt + "'");
    uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("shape has a negative or non-integer size");
      const uint64_t di = d.get<uint64_t>();
      if (di != 0 && numel > (uint64_t(1) << 62) / di) bad("shape is too large");
      numel *= di;
      t.shape.push_back(int64_t(di));
    }
    for (const json& o : v["data_offsets"])
      if (!o.is_number_unsigned()) bad("data_offsets are not non-negative integers");
    const uint64_t b = v["data_offsets"][0].get<uint64_t>(), e = v["data_offsets"][1].get<uint64_t>();
    if (e < b) bad("data_offsets end before they begin");
    if (e > data_size)
      bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + ") lie outside the file's " +
          std::to_string(data_size) + " data bytes (truncated file?)");
    const uint64_t want = numel * dtype_size(t.dtype);
    if (e - b != want)
      bad("shape " + t.shape_str() + " of " + dt + " needs " + std::to_string(want) + " bytes but data_offsets span " +
          std::to_string(e - b));
    t.data = file_.data() + data_start + b;
    t.nbytes = size_t(e - b);
    auto [pos, inserted] = tensors_.emplace(name, std::move(t));
    if (!inserted) bad("appears twice");
    spans.push_back({b, e, &pos->first});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.b < b.b; });
  const Span* last = nullptr;  // the non-empty span that reaches furthest so far
  for (const Span& s : spans) {
    if (s.e == s.b) continue;
    if (last && s.b < last->e)
      fail_file(path, "tensors " + *last->name + " and " + *s.name + " overlap in the file");
    if (!last || s.e > last->e) last = &s;
  }
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------------------------
namespace {
bool is_pickle_name(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".bin" || e == ".pt" || e == ".pth" || e == ".ckpt" || e == ".pkl";
}
[[noreturn]] void refuse_pickle(const std::string& file) {
  fail_file(file,
            "PyTorch pickle checkpoints are not loaded (unpickling can run code the file carries); convert it once "
            "with: python3 -c \"import torch; from safetensors.torch import save_file; "
            "save_file(torch.load('IN.bin', weights_only=True), 'model.safetensors')\"");
}
}  // namespace

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  fs::path p(path);
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(p, ec)) {
    const fs::path index = p / "model.safetensors.index.json";
    const fs::path single = p / "model.safetensors";
    if (fs::exists(index)) {
      json j;
      try {
        j = parse_json(read_text_file(index.string(), 64u << 20, "shard index"), index.string());
      } catch (const json::exception& e) {
        fail_file(index.string(), std::string("not valid JSON (") + e.what() + ")");
      }
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail_file(index.string(), "has no weight_map object");
      std::map<std::string, std::string> wanted;  // tensor -> shard
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) fail_file(index.string(), "weight_map entry " + it.key() + " is not a file name");
        std::string shard = it.value().get<std::string>();
        while (shard.rfind("./", 0) == 0) shard.erase(0, 2);  // "./x.safetensors" is x.safetensors
        if (shard.empty() || shard == "." || shard == "..")
          fail_file(index.string(), "weight_map entry " + it.key() + " names no file ('" + it.value().get<std::string>() + "')");
        if (shard == ".." || shard.rfind("../", 0) == 0 || shard.find("/../") != std::string::npos || shard[0] == '/')
          fail_file(index.string(), "shard name '" + shard + "' points outside the model folder");
        if (shard.find('/') != std::string::npos)
          fail_file(index.string(), "shard name '" + shard + "' is in a subfolder: shards must sit beside the index");
        wanted[it.key()] = shard;
        if (std::find(files.begin(), files.end(), shard) == files.end()) files.push_back(shard);
      }
      std::map<std::string, size_t> file_idx;
      for (const std::string& f : files) {
        const fs::path fp = p / f;
        if (is_pickle_name(fp)) refuse_pickle(fp.string());
        files_.push_back(std::make_unique<SafetensorsFile>(fp.string()));
        file_idx[f] = files_.size() - 1;
      }
      for (const auto& [name, shard] : wanted) {
        const TensorInfo* t = files_[file_idx[shard]]->find(name);
        if (!t) fail_file((p / shard).string(), "missing tensor " + name + " (listed in model.safetensors.index.json)");
        index_[name] = t;
      }
      return;
    }
    if (fs::exists(single)) {
      files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    } else {
      // Any other *.safetensors? Otherwise explain what is there.
      std::vector<fs::path> st, pk;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        if (e.path().extension() == ".safetensors") st.push_back(e.path());
        if (is_pickle_name(e.path())) pk.push_back(e.path());
      }
      std::sort(st.begin(), st.end());
      if (st.empty() && !pk.empty()) refuse_pickle(pk.front().string());
      if (st.empty()) fail_file(path, "no model.safetensors (or model.safetensors.index.json) in this folder");
      for (const auto& f : st) files_.push_back(std::make_unique<SafetensorsFile>(f.string()));
    }
  } else if (fs::exists(p, ec)) {
    if (is_pickle_name(p)) refuse_pickle(path);
    files_.push_back(std::make_unique<SafetensorsFile>(path));
  } else {
    fail_file(path, "no such file or folder");
  }
  for (const auto& f : files_)
    for (const auto& [name, t] : f->tensors()) {
      if (index_.count(name)) fail_file(f->path(), "tensor " + name + " is also in another file of this checkpoint");
      index_[name] = &t;
    }
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) fail_file(files_.size() == 1 ? files_[0]->path() : path_, "missing tensor " + name);
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> v;
  for (const auto& kv : index_) v.push_back(kv.first);
  return v;
}

size_t Checkpoint::total_bytes() const {
  size_t s = 0;
  for (const auto& kv : index_) s += kv.second->nbytes;
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
void tensor_to_f32(const TensorInfo& t, float* out) {
  const size_t n = size_t(t.numel());
  constexpr size_t kChunk = 1 << 16;  // elements per guarded copy
  std::vector<uint8_t> buf;
  for (size_t i0 = 0; i0 < n; i0 += kChunk) {
    const size_t m = std::min(kChunk, n - i0);
    switch (t.dtype) {
      case DType::F32:
        guarded_copy(t, out + i0, i0 * 4, m * 4);
        break;
      case DType::BF16:
      case DType::F16: {
        buf.resize(m * 2);
        guarded_copy(t, buf.data(), i0 * 2, m * 2);
        const uint16_t* h = reinterpret_cast<const uint16_t*>(buf.data());
        if (t.dtype == DType::BF16)
          for (size_t i = 0; i < m; ++i) out[i0 + i] = bf16_to_f32(h[i]);
        else
          for (size_t i = 0; i < m; ++i) out[i0 + i] = f16_to_f32(h[i]);
        break;
      }
      case DType::F64: {
        buf.resize(m * 8);
        guarded_copy(t, buf.data(), i0 * 8, m * 8);
        const double* d = reinterpret_cast<const double*>(buf.data());
        for (size_t i = 0; i < m; ++i) out[i0 + i] = float(d[i]);
        break;
      }
      case DType::I64: {
        buf.resize(m * 8);
        guarded_copy(t, buf.data(), i0 * 8, m * 8);
        const int64_t* d = reinterpret_cast<const int64_t*>(buf.data());
        for (size_t i = 0; i < m; ++i) out[i0 + i] = float(d[i]);
        break;
      }
      case DType::I32: {
        buf.resize(m * 4);
        guarded_copy(t, buf.data(), i0 * 4, m * 4);
        const int32_t* d = reinterpret_cast<const int32_t*>(buf.data());
        for (size_t i = 0; i < m; ++i) out[i0 + i] = float(d[i]);
        break;
      }
      default:
        fail_file(t.file, "tensor " + t.name + " has dtype " + dtype_name(t.dtype) + ", which cannot be read as float");
    }
  }
}

std::vector<float> tensor_to_f32(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  tensor_to_f32(t, v.data());
  return v;
}

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<uint64_t> sizes;
  for (const TensorOut& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= uint64_t(d);
    h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    sizes.push_back(n);
    off += n;
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8) hs += ' ';  // align the data start, as the reference writer does
  SafeWriter out(path, "the safetensors file");  // a failed write leaves the previous file whole
  uint8_t len[8];
  uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  out.write(len, 8);
  out.write(hs);
  for (size_t i = 0; i < tensors.size(); ++i) out.write(tensors[i].data, size_t(sizes[i]));
  out.commit();
}

}  // namespace ds
