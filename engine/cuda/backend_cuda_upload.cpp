// Weights to the device: each tensor is read from its mapping chunk by chunk through ds::guarded_copy (a file
// truncated under the mapping gives ds::Error, not SIGBUS), converted to bf16 on the host into one of two pinned
// staging buffers, and copied asynchronously; while one buffer is in flight the other is being filled.
#include <algorithm>
#include <cstring>
#include <thread>

#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/dtype.h"
#include "engine/core/safetensors.h"

namespace ds::cuda {

namespace {

// Converts [begin, end) with a few threads when the chunk is large (f32 -> bf16 runs at ~1-2 GB/s per core).
template <class F>
void parallel_for(size_t count, F&& f) {
  const size_t nt = std::min<size_t>(8, std::max(1u, std::thread::hardware_concurrency()));
  if (count < (size_t(1) << 20) || nt == 1) {
    f(size_t(0), count);
    return;
  }
  std::vector<std::thread> th;
  const size_t per = (count + nt - 1) / nt;
  for (size_t t = 0; t < nt; ++t) {
    const size_t b = t * per, e = std::min(count, b + per);
    if (b < e) th.emplace_back([&f, b, e] { f(b, e); });
  }
  for (auto& x : th) x.join();
}

}  // namespace

WeightUploader::WeightUploader(cudaStream_t stream, const ProgressFn& progress, size_t total_bytes)
    : stream_(stream), progress_(progress), total_(total_bytes) {
  stage_[0] = PinnedBuffer(kChunk * 2);
  stage_[1] = PinnedBuffer(kChunk * 2);
}

void WeightUploader::to_bf16(const TensorInfo& t, bf16* dst) {
  const size_t numel = size_t(t.numel());
  const size_t esz = dtype_size(t.dtype);
  if (t.dtype != DType::BF16 && t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::F64)
    throw Error(t.file + ": tensor " + t.name + " has dtype " + dtype_name(t.dtype) +
                ", which the CUDA backend cannot use as a weight");
  for (size_t off = 0; off < numel; off += kChunk) {
    const size_t cnt = std::min(kChunk, numel - off);
    DS_CUDA_CHECK(cudaEventSynchronize(free_[cur_].get()));  // the copy out of this buffer has finished
    uint16_t* st = stage_[cur_].as<uint16_t>();
    if (t.dtype == DType::BF16) {
      guarded_copy(t, st, off * 2, cnt * 2);
    } else {
      raw_.resize(cnt * esz);
      guarded_copy(t, raw_.data(), off * esz, cnt * esz);
      const uint8_t* r = raw_.data();
      const DType dt = t.dtype;
      parallel_for(cnt, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
          float v;
          if (dt == DType::F32) {
            std::memcpy(&v, r + i * 4, 4);
          } else if (dt == DType::F16) {
            uint16_t h;
            std::memcpy(&h, r + i * 2, 2);
            v = f16_to_f32(h);
          } else {
            double x;
            std::memcpy(&x, r + i * 8, 8);
            v = float(x);
          }
          st[i] = f32_to_bf16(v);
        }
      });
    }
    DS_CUDA_CHECK(cudaMemcpyAsync(dst + off, st, cnt * 2, cudaMemcpyHostToDevice, stream_));
    DS_CUDA_CHECK(cudaEventRecord(free_[cur_].get(), stream_));
    cur_ ^= 1;
    done_ += cnt * 2;
    if (progress_ && total_) progress_(std::min(1.0, double(done_) / double(total_)), "uploading " + t.name);
  }
}

void WeightUploader::to_bf16(const std::vector<float>& host, bf16* dst, const std::string& name) {
  for (size_t off = 0; off < host.size(); off += kChunk) {
    const size_t cnt = std::min(kChunk, host.size() - off);
    DS_CUDA_CHECK(cudaEventSynchronize(free_[cur_].get()));
    uint16_t* st = stage_[cur_].as<uint16_t>();
    const float* src = host.data() + off;
    parallel_for(cnt, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) st[i] = f32_to_bf16(src[i]);
    });
    DS_CUDA_CHECK(cudaMemcpyAsync(dst + off, st, cnt * 2, cudaMemcpyHostToDevice, stream_));
    DS_CUDA_CHECK(cudaEventRecord(free_[cur_].get(), stream_));
    cur_ ^= 1;
    done_ += cnt * 2;
    if (progress_ && total_) progress_(std::min(1.0, double(done_) / double(total_)), "uploading " + name);
  }
}

void WeightUploader::finish() { DS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace ds::cuda
