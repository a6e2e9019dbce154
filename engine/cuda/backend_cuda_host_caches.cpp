// Host caches of the CUDA backend (backend_cuda_impl.h): a prompt whose layers' streams and Q/K/V do not fit the
// device, as on a 24 GB card that holds half of a 12.7B model's weights and must keep 32K tokens of every layer's
// rows, keeps those rows in pinned host memory.
//
// The device holds two slots of each: Stream(l) in hidden slot (l - first) & 1 and layer l's Q/K/V in qkv slot
// (its index) & 1. Layer l reads Stream(l) and writes Stream(l + 1) and its Q/K/V, so the slots that layer l + 2 takes
// are free once the copy stream has written layer l's rows back to the host, which it does while layer l + 1 runs
// (its rows are not written again in between). A reader (maps, rows, statistics, row masses, lens, outliers, a split's
// hand-off) pages a layer's rows into its slot first. A decoding step reads each layer's K and V from the device where
// the prompt's idle scratch holds them (filled once), else pages them in before that layer, and writes its new rows to
// the host after it. The kernels are the ones of the device-resident path, on the same rows: results are
// bit-identical (tests/test_split_backend.cpp, SplitBackendCuda.HostCaches*).
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/core/env.h"
#include "engine/core/error.h"
#include "engine/core/input_limits.h"
#include "engine/cuda/detail/backend_cuda_impl.h"

namespace ds::cuda {

HostCacheBuffer::HostCacheBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  if (!env_switch("DS_HOST_CACHES_REGISTER", true)) {
    DS_CUDA_CHECK(cudaMallocHost(&p_, bytes));
    return;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error("host caches: cannot map " + gib(bytes) + " of host memory");
  madvise(p, bytes, MADV_HUGEPAGE);  // (a hint: fewer pages to fault in and to pin)
  // Each thread faults in its share (the kernel zeroes the pages there, in parallel)
  const size_t nt = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16), page = 4096;
  const size_t share = (bytes / nt + page - 1) / page * page;
  std::vector<std::thread> threads;
  try {
    for (size_t i = 0; i < nt && i * share < bytes; ++i)
      threads.emplace_back([p, bytes, share, i] {
        volatile char* b = static_cast<char*>(p);
        for (size_t o = i * share, e = std::min(bytes, (i + 1) * share); o < e; o += page) b[o] = 0;
      });
  } catch (const std::exception&) {  // fewer threads: cudaHostRegister faults in the rest
  }
  for (std::thread& t : threads) t.join();
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    munmap(p, bytes);
    throw Error("host caches: cannot pin " + gib(bytes) + " of host memory (" + cudaGetErrorString(e) + ")");
  }
  p_ = p;
  mapped_ = true;
}

void HostCacheBuffer::release() noexcept {
  if (!p_) return;
  if (mapped_) {
    cudaHostUnregister(p_);
    munmap(p_, bytes_);
  } else {
    cudaFreeHost(p_);
  }
  cudaGetLastError();  // (nothing to tell from a destructor)
  p_ = nullptr;
}

namespace {
// Host memory left to the rest of the machine when the caches are sized.
constexpr uint64_t kHostReserve = uint64_t(2) << 30;
}  // namespace

bool CudaBackend::host_caches_possible() const {
  return host_caches_mode_ != 0 && loaded_ && qkv_slots_ > 0 && cfg_.self_attention_only();
}

int64_t CudaBackend::host_tokens() const {
  const size_t E = size_t(cfg_.hidden), W = size_t(qkv_width()), L = size_t(end_layer() - first_);
  const uint64_t per = (L + 1) * E * 4 + size_t(qkv_slots_) * W * 2;
  const uint64_t avail = available_memory_bytes() + act_.host_hidden.bytes() + act_.host_qkv.bytes();
  return avail > kHostReserve ? int64_t((avail - kHostReserve) / per) : 0;
}

int64_t CudaBackend::hc_rows() const {
  return std::min<int64_t>(act_.cap, std::max<int64_t>(hc_.rows, int64_t(last_batch_) * last_n_));
}

float* CudaBackend::host_stream(int l) const {
  return act_.host_hidden.as<float>() + size_t(l - first_) * size_t(act_.cap) * size_t(cfg_.hidden);
}

namespace {
bf16* host_qkv_of(const Activations& a, int slot, int64_t W) {
  return a.host_qkv.as<bf16>() + size_t(slot) * size_t(a.cap) * size_t(W);
}
void record(const std::unique_ptr<CudaEvent>& e, cudaStream_t s) { DS_CUDA_CHECK(cudaEventRecord(e->get(), s)); }
void wait(cudaStream_t s, const std::unique_ptr<CudaEvent>& e) { DS_CUDA_CHECK(cudaStreamWaitEvent(s, e->get(), 0)); }
}  // namespace

void CudaBackend::hc_run_start(int from, int64_t rows) {
  hc_.rows = rows;
  if (!hc_.copy) {  // (created with the first host-cached run, on this backend's device)
    cudaStream_t st = nullptr;
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    hc_.copy.reset(st);
    for (auto* e : {&hc_.stream_done[0], &hc_.stream_done[1], &hc_.qkv_done[0], &hc_.qkv_done[1], &hc_.layer_done,
                    &hc_.copies})
      *e = std::make_unique<CudaEvent>();
  }
  wait(stream(), hc_.copies);  // the last forward's write-backs have read the slots this one writes
  hc_.kv_gen = -1;             // (its scratch is no longer a decoding step's K and V)
  if (from == first_) {
    hc_.stream_res[0] = first_;  // the embedding or the hand-off writes it
    if (hc_.stream_res[1] == first_) hc_.stream_res[1] = -1;
  } else {
    page_stream(from);
  }
}

void CudaBackend::hc_wait_copies() const {
  if (hc_.copy) DS_CUDA_CHECK(cudaStreamSynchronize(hc_.copy.get()));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaBackend::page_stream(int l) const {
  const int s = (l - first_) & 1;
  if (hc_.stream_res[s] == l) return;
  if (hc_.copies) wait(stream(), hc_.copies);  // the host rows written, and no write-back still reading the slot
  DS_CUDA_CHECK(cudaMemcpyAsync(stream_ptr(l), host_stream(l), size_t(hc_rows()) * size_t(cfg_.hidden) * 4,
                                cudaMemcpyHostToDevice, stream()));
  hc_.stream_res[s] = l;
}

void CudaBackend::page_qkv(int l) const {
  const int slot = qkv_slot_.at(size_t(l));
  if (slot < 0) throw Error(cfg_.no_attention(l, "queries or keys"));
  if (hc_.qkv_res[slot & 1] == l) return;
  if (hc_.copies) wait(stream(), hc_.copies);
  const int64_t W = qkv_width();
  DS_CUDA_CHECK(cudaMemcpyAsync(qkv_slot(l), host_qkv_of(act_, slot, W), size_t(hc_rows()) * size_t(W) * 2,
                                cudaMemcpyHostToDevice, stream()));
  hc_.qkv_res[slot & 1] = l;
}

void CudaBackend::hc_layer_begin(int l, bool decode) {
  const int slot = qkv_slot_.at(size_t(l));
  if (decode) {  // the cached positions' K and V of the layer into its slot (the step writes the new row's)
    const int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, d = cfg_.head_dim, W = qkv_width(), pos = last_n_;
    if (hc_.kv_gen != act_gen_) {  // the layers whose K and V the idle prompt scratch holds, first to last
      const size_t per = size_t(act_.cap) * size_t(2 * Hkv * d) * 2;
      hc_.kv_res.assign(size_t(cfg_.layers), nullptr);
      hc_.kv_filled.assign(size_t(cfg_.layers), 0);
      int next = first_;
      for (const DeviceBuffer* b : {&act_.scratch32, &act_.act, &act_.attn, &act_.x})
        for (size_t off = 0; off + per <= b->bytes() && next < end_layer(); off += per)
          hc_.kv_res[size_t(next++)] = reinterpret_cast<bf16*>(b->as<char>() + off);
      hc_.kv_gen = act_gen_;
    }
    hc_.qkv_res[slot & 1] = -1;  // (its queries are another layer's)
    if (bf16* r = hc_.kv_res[size_t(l)]) {
      if (!hc_.kv_filled[size_t(l)])
        DS_CUDA_CHECK(cudaMemcpy2DAsync(r, size_t(2 * Hkv * d) * 2, host_qkv_of(act_, slot, W) + H * d, size_t(W) * 2,
                                        size_t(2 * Hkv * d) * 2, size_t(pos), cudaMemcpyHostToDevice, stream()));
      hc_.kv_filled[size_t(l)] = 1;
      return;
    }
    DS_CUDA_CHECK(cudaMemcpy2DAsync(qkv_slot(l) + H * d, size_t(W) * 2, host_qkv_of(act_, slot, W) + H * d,
                                    size_t(W) * 2, size_t(2 * Hkv * d) * 2, size_t(pos), cudaMemcpyHostToDevice,
                                    stream()));
    return;
  }
  // The slots Stream(l + 1) and layer l's Q/K/V take: the rows they held (layer l - 2's) are on the host first
  const int ss = (l + 1 - first_) & 1;
  wait(stream(), hc_.stream_done[ss]);
  wait(stream(), hc_.qkv_done[slot & 1]);
  hc_.stream_res[ss] = l + 1;
  hc_.qkv_res[slot & 1] = l;
  hc_.qkv_written = false;
  if (l == first_ && run_from_ == first_) {  // the block's input (the embedding or the hand-off) to the host too
    hc_write_back_stream(l, hc_.stream_done[(l - first_) & 1]);
    record(hc_.copies, hc_.copy.get());
  }
}

void CudaBackend::hc_write_back_stream(int l, const std::unique_ptr<CudaEvent>& done) {
  record(hc_.layer_done, stream());
  wait(hc_.copy.get(), hc_.layer_done);
  DS_CUDA_CHECK(cudaMemcpyAsync(host_stream(l), stream_ptr(l), size_t(hc_.rows) * size_t(cfg_.hidden) * 4,
                                cudaMemcpyDeviceToHost, hc_.copy.get()));
  record(done, hc_.copy.get());
}

void CudaBackend::hc_layer_end(int l, bool decode) {
  const int slot = qkv_slot_.at(size_t(l));
  const int64_t W = qkv_width();
  if (decode) {  // the step's Q/K/V row of the layer (at the position) to the host
    const int64_t pos = last_n_;
    DS_CUDA_CHECK(cudaMemcpyAsync(host_qkv_of(act_, slot, W) + pos * W, qkv_slot(l) + pos * W, size_t(W) * 2,
                                  cudaMemcpyDeviceToHost, stream()));
    return;
  }
  hc_write_back_stream(l + 1, hc_.stream_done[(l + 1 - first_) & 1]);  // (the copy stream then waits for the layer)
  if (hc_.qkv_written) {
    DS_CUDA_CHECK(cudaMemcpyAsync(host_qkv_of(act_, slot, W), qkv_slot(l), size_t(hc_.rows) * size_t(W) * 2,
                                  cudaMemcpyDeviceToHost, hc_.copy.get()));
    record(hc_.qkv_done[slot & 1], hc_.copy.get());
  } else {
    hc_.qkv_res[slot & 1] = -1;  // a kept attention output ran: the slot holds no Q/K/V of this layer
  }
  record(hc_.copies, hc_.copy.get());
}

void CudaBackend::hc_decode_kv(int l, kern::AttnParams& p) const {
  bf16* r = hc_.kv_gen == act_gen_ ? hc_.kv_res.at(size_t(l)) : nullptr;
  if (!r) return;
  p.kv = r;  // [cap][K of the kv heads | V of the kv heads]
  p.kv_row_stride = 2 * cfg_.kv_heads * cfg_.head_dim;
  p.k_off = 0;
  p.v_off = cfg_.kv_heads * cfg_.head_dim;
}

void CudaBackend::hc_decode_row_kv(int l) {
  bf16* r = hc_.kv_gen == act_gen_ ? hc_.kv_res.at(size_t(l)) : nullptr;
  if (!r) return;
  const int64_t H = cfg_.heads, KV = 2 * cfg_.kv_heads * cfg_.head_dim, W = qkv_width(), pos = last_n_;
  DS_CUDA_CHECK(cudaMemcpyAsync(r + pos * KV, qkv_slot(l) + pos * W + H * cfg_.head_dim, size_t(KV) * 2,
                                cudaMemcpyDeviceToDevice, stream()));
}

void CudaBackend::hc_decode_rows(int64_t pos) {
  const size_t E = size_t(cfg_.hidden);
  DS_CUDA_CHECK(cudaMemcpy2DAsync(host_stream(first_) + size_t(pos) * E, size_t(act_.cap) * E * 4,
                                  dec_->h.as<float>() + size_t(first_) * E, E * 4, E * 4,
                                  size_t(end_layer() - first_ + 1), cudaMemcpyDeviceToHost, stream()));
  hc_.stream_res[0] = hc_.stream_res[1] = -1;  // (the slots lack the new row)
}

}  // namespace ds::cuda
