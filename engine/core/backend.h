// The interface every compute backend implements (CPU and CUDA). The session drives it layer-range by
// layer-range: a lambda change re-runs from the first changed layer, reusing the cached inputs of earlier layers.
// This header belongs to the core library: the backends implement it, and each one's own header (backend_cpu.h,
// backend_cuda.h) says how to make one; backends.h chooses between them.
//
// Shapes: n = tokens, L = layers, Hv = view heads (differential heads for DiffLlama, query heads for Llama).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/forward.h"
#include "engine/core/map_query.h"
#include "engine/core/model.h"
#include "engine/core/outlier_select.h"

namespace ds {

using ProgressFn = std::function<void(double fraction, const std::string& what)>;

struct ForwardRequest {
  std::vector<int32_t> ids;      // [n]
  std::vector<float> lambda;     // [L] lambda each DiffLlama layer uses (ignored for Llama)
  int from_layer = 0;            // > 0: layers below reuse the previous call's activations (same ids required)
  // > 0: decoding. ids[0, append_from) are the previous call's ids, already run (its length must be append_from and
  // lambda the same); only positions [append_from, n) run, through every layer, reading the cached keys and values
  // (and recurrent state) of the earlier ones. The logits are the last position's. from_layer must be 0.
  int64_t append_from = 0;
  bool all_logits = false;       // logits for every position [n, vocab], else only the last [1, vocab]
  std::vector<uint8_t> want_maps;  // [L] (or empty = none): fill ForwardResult::maps for these layers
  bool keep_hidden = false;      // fill ForwardResult::hidden (tests)
  bool all_rows = false;         // every row through the last layer (the outlier statistics read them all)
  // Decoding (append_from > 0) may leave the logits where they were computed: ForwardResult::logits then stays
  // empty, ForwardResult::argmax holds the greedy choice, and Backend::fetch_logits brings the logits when asked.
  // A prompt's forward (last-position logits) may leave them too, and return before its work is done (argmax -1):
  // many re-runs then follow each other without a wait, each queueing its Backend::queue_logprob (head importance).
  // A backend that computes on the host fills the logits anyway.
  bool logits_on_demand = false;
  // false: no per-kernel profile of this forward (bulk re-runs such as head importance's: timing events and the
  // per-head counters cost a wait each); Backend::profile() keeps the last profiled forward's.
  bool profile = true;
  // >= 0: keep this layer's attention output (before its head writers) for the forwards after this one that re-run
  // from it with the same input, lambda and attention edits (fwd::Ops::keep_attention): head importance's ablations
  // of one layer by head writers. A backend may ignore it.
  int keep_attention = -1;
  // Polled between layers and between pieces of a layer's work (a prompt's forward only, append_from = 0): when it
  // returns true the backend stops and throws ForwardCancelled (error.h) with the first layer it did not finish;
  // the layers below it hold this request's results, so the next forward may start there (from_layer). A backend
  // whose layers take milliseconds may ignore it. The GUI stops a re-run whose lambda the user has moved on from.
  std::function<bool()> cancel;
  // Readers and writers at the forward's hook points (forward.h). Null or empty: none, at no cost. A decoding step
  // must bring the hooks its prompt ran with.
  std::shared_ptr<const fwd::Hooks> hooks;
  // The attention op's edits per layer ([L]; head coefficients and key knockouts, forward.h AttnEdit). Null: none.
  // A decoding step must bring the edits its prompt ran with; the map queries read the last forward's.
  std::shared_ptr<const std::vector<fwd::AttnEdit>> edits;
  // A later block of a layer split (Backend::set_layer_range with first > 0): Stream(first)'s rows of this call
  // (every position of a prompt, the new one of a decoding step), [rows, hidden] f32, on the host (stream_in_device
  // < 0) or on GPU stream_in_device (then copied peer to peer). The previous block's Backend::stream_rows.
  const float* stream_in = nullptr;
  int stream_in_device = -1;
};

struct LayerMaps {
  int64_t heads = 0, n = 0;
  std::vector<float> a1;  // [Hv, n, n] post-softmax map 1 (Llama: the only map)
  std::vector<float> a2;  // [Hv, n, n] post-softmax map 2 (empty for Llama)
  // Set by the caller of Backend::layer_maps: the maps go to this memory on the backend's CUDA device instead of a1 /
  // a2 (which stay empty; device_out2 only for differential models). The CUDA backend only; the call returns when
  // the memory holds the maps. (The Python module's device arrays.)
  float* device_out1 = nullptr;
  float* device_out2 = nullptr;
  bool empty() const { return a1.empty(); }
};

struct ForwardResult {
  int64_t n = 0;
  int64_t logit_rows = 0;            // n or 1
  std::vector<float> logits;         // [logit_rows, vocab]; empty when left on the device (logits_on_demand)
  int32_t argmax = -1;               // with logits left on the device: the first largest last-row logit's id
  std::vector<LayerMaps> maps;       // [L]; entries empty where not requested
  std::vector<std::vector<float>> hidden;  // [L+1][n, hidden]: input of layer l; [L] = last layer's output
  double ms = 0;                     // wall time of this forward
};

// Timing of the last forward, for the profiler panel. Attention time per (layer, head) is measured by the
// backend; FLOPs follow kernels/attn_heads.h (12 n^2 d per differential head, 4 n^2 d per plain head, halved for causal).
struct HeadTiming {
  int layer = 0, head = 0;
  double ms = 0;
  double flops = 0;
};
struct KernelTiming {
  std::string name;
  int64_t count = 0;
  double total_ms = 0, min_ms = 0, max_ms = 0;
};
// One device's part of the last forward under a layer split (Profile::lanes): its block of layers, when its work ran
// (host wall clock from the forward's start to the block's finish; a block the re-run did not reach has start = end),
// the hand-off copy of the residual stream into it, and its kernels' summed time.
struct DeviceLane {
  std::string device;  // "GPU 1", "CPU 0"
  int first_layer = 0, end_layer = 0;
  double start_ms = 0, end_ms = 0, handoff_ms = 0, kernels_ms = 0;
};
struct Profile {
  std::vector<HeadTiming> heads;
  std::vector<KernelTiming> kernels;
  std::vector<DeviceLane> lanes;  // a layer split's devices, in layer order (empty: one device)
  double forward_ms = 0;
  int64_t tokens = 0;
  double peak_tflops = 0;  // measured matrix peak of the device (0 = unknown)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // shown to the user: "CPU (OpenBLAS, 2 threads)", "CUDA: NVIDIA H200"
  virtual std::string kind() const = 0;  // "cpu" or "cuda"
  // Take the weights. The Model may be destroyed afterwards.
  virtual void load(const Model& model, const ProgressFn& progress) = 0;
  virtual void forward(const ForwardRequest& req, ForwardResult& out) = 0;
  // Maps of one layer for the last forward, computed on demand from cached activations. O(n^2): small prompts
  // (the CLI's --dump, tests); everything else uses the queries below.
  virtual void layer_maps(int layer, LayerMaps& out) = 0;
  // Queries on the last forward's maps (map_query.h), O(n) or O(view) in host memory and transfers.
  virtual void map_view(const ViewRequest& req, MapView& out) = 0;
  virtual void map_rows(int layer, const std::vector<int64_t>& positions, MapRows& out) = 0;  // resolved positions
  // [view heads]. lambda: the lambda the difference's statistics use (default: the layer's in the last forward); a
  // layer's maps do not depend on its own lambda, so another value needs no new forward (the GUI's lambda sweep).
  virtual std::vector<HeadStats> head_stats(int layer, std::optional<float> lambda = std::nullopt) = 0;
  // HeadStats::entropy_diff of view head `head` under each of `lambdas` (the GUI's lambda sweep), from the last
  // forward's maps: no new forward, since a layer's maps do not depend on its own lambda. This default asks
  // head_stats once per value; a backend may answer in one pass over the head's rows.
  virtual std::vector<double> entropy_sweep(int layer, int head, const std::vector<float>& lambdas) {
    std::vector<double> out;
    for (float lam : lambdas) out.push_back(double(head_stats(layer, lam).at(size_t(head)).entropy_diff));
    return out;
  }
  // Row q of every view head of `layer` split into a key span, the sink and the rest (map_query.h), [view heads];
  // O(heads) back from the device.
  virtual std::vector<RowMass> row_mass(int layer, int64_t q, int64_t a0, int64_t a1) = 0;
  // The same for each of `layers` ([layers][view heads]): a scan's every prompt. This default asks row_mass layer by
  // layer; a backend may answer with one wait.
  virtual std::vector<std::vector<RowMass>> row_masses(const std::vector<int>& layers, int64_t q, int64_t a0,
                                                       int64_t a1) {
    std::vector<std::vector<RowMass>> out;
    for (int l : layers) out.push_back(row_mass(l, q, a0, a1));
    return out;
  }
  // The implicit attention of one channel (req.head) of a Mamba layer's scan for the last forward, pooled as a view
  // (map_query.h, "implicit attention"); recomputed from the layer's cached input, O(view) back to the host.
  virtual void mamba_view(const ViewRequest& req, MapView& out) = 0;
  // Row q of the same map, exact (keys 0..q, no pooling), into row [q + 1]; the layer's scan inputs are recomputed
  // once for the whole row, O(n) back to the host. The GUI's row view of a Mamba channel.
  virtual void mamba_row(int layer, int channel, int64_t q, std::vector<float>& row) = 0;
  virtual Profile profile() const = 0;
  // Largest prompt this backend can run for the loaded model (memory), for the limit check before a run.
  virtual int64_t max_tokens() const = 0;
  // Drops positions >= n of the last forward (generation back to its prompt) when every cached layer can: the next
  // forward may then reuse layers (from_layer) or append to the first n ids. false: a layer keeps state that cannot
  // be cut (Mamba's recurrent state); nothing changed, and the caller runs the n ids again.
  virtual bool truncate(int64_t n) = 0;
  // The last forward's logits when it left them on the device (ForwardRequest::logits_on_demand); else nothing.
  virtual void fetch_logits(ForwardResult& out) { (void)out; }
  // log p(id) under the last forward's last-position logits into slot `slot` (0..255) of this backend's queued
  // values, without waiting for the forward; take_logprobs(count) waits and returns slots [0, count). false: this
  // backend does not queue (the caller computes it from the logits).
  virtual bool queue_logprob(int32_t id, int slot) { (void)id, (void)slot; return false; }
  virtual std::vector<double> take_logprobs(int count) { (void)count; return {}; }
  // The logit lens (session_lens.h): the final norm and the LM head applied to the residual stream leaving layer
  // `layer` < L - 1 (fwd::lens) at `position` of the last forward: [vocab] f32 into out.
  virtual void lens_logits(int layer, int64_t position, float* out) = 0;
  // The outlier statistics' passes (session_outliers.h, outlier_select.h) over |x| of layer `layer`'s values in the
  // last forward: logits false, every position and channel of the stream leaving the layer (the forward must have
  // run every row); true, q.k / sqrt(d) over every causal cell inside the window of every view head's map 1 and map 2
  // (Llama: map 1), recomputed from the cached Q and K. outlier_counts fills counts [maps][pass.histograms()][bins];
  // outlier_values gives, per map, the values >= at_least[map] (throws when more than cap).
  virtual void outlier_counts(int layer, bool logits, const RadixPass& pass, std::vector<uint64_t>& counts) = 0;
  virtual std::vector<std::vector<float>> outlier_values(int layer, bool logits, const std::vector<float>& at_least,
                                                         size_t cap) = 0;
  // The same for several sources at once (a pass over every layer): counts[i] for query i; values[i][map]. A device
  // backend launches them all and copies back once (each call a round trip made the statistics of 16 layers at 4K
  // tokens a quarter of a forward); by default one call each. outlier_counts_many also collects, where `values` is
  // given and query i has thresholds (at_least, one per map), (*values)[i][map] as outlier_values would (in the same
  // pass on a device: the last radix pass then brings the top values too); queries without thresholds get none.
  struct OutlierQuery {
    int layer = 0;
    bool logits = false;
    RadixPass pass;               // outlier_counts_many
    std::vector<float> at_least;  // outlier_values_many, and outlier_counts_many's collection
    size_t cap = 0;
  };
  using OutlierValues = std::vector<std::vector<std::vector<float>>>;  // [query][map][values]
  virtual void outlier_counts_many(const std::vector<OutlierQuery>& q, std::vector<std::vector<uint64_t>>& counts,
                                   OutlierValues* values) {
    counts.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) outlier_counts(q[i].layer, q[i].logits, q[i].pass, counts[i]);
    if (!values) return;
    values->assign(q.size(), {});
    for (size_t i = 0; i < q.size(); ++i)
      if (!q[i].at_least.empty()) (*values)[i] = outlier_values(q[i].layer, q[i].logits, q[i].at_least, q[i].cap);
  }
  virtual OutlierValues outlier_values_many(const std::vector<OutlierQuery>& q) {
    OutlierValues out;
    for (const OutlierQuery& x : q) out.push_back(outlier_values(x.layer, x.logits, x.at_least, x.cap));
    return out;
  }
  // The hidden states' statistics of every layer with the selection itself on the device (the radix passes and the
  // RankFinder steps between them queued back to back, one wait): per layer l, top[l] its 100 largest |x|, largest
  // first (all of them in a smaller set; or, where more values tie at its 100th than the device collects, every
  // value >= the 100th, unsorted), middle[l] its values at ascending ranks (count - 1) / 2
  // and count / 2; model_middle the same over every layer's values. false: this backend leaves the selection to the
  // caller (the passes above).
  struct HiddenSelection {
    std::vector<std::vector<float>> top;
    std::vector<std::pair<float, float>> middle;
    std::pair<float, float> model_middle{0.f, 0.f};
  };
  virtual bool outlier_hidden_select(HiddenSelection& out) { (void)out; return false; }
  // [L]: the largest |hidden state| of each layer's output over the sequence, from the last forwards' max_abs
  // readers (fwd::max_abs_hidden_hook; NaN for a layer none read); empty when the last forward had no hooks.
  virtual std::vector<float> layer_max_abs() const = 0;
  // Device memory in use by this process (bytes), for soak tests; -1 where there is no device.
  virtual int64_t device_memory_used() const { return -1; }

  // Devices the model's layers are spread over (a layer split: more than one).
  virtual int devices_used() const { return 1; }

  // --- a layer split's block (engine/session/split_backend.h) ---
  // Holds and runs layers [first, last) only; called before load (false: this backend cannot). The embedding lives
  // where layer 0 does, the final norm and the LM head where the last layer does: a block without them returns no
  // logits, and a later block starts from ForwardRequest::stream_in. Queries name only the block's layers.
  virtual bool set_layer_range(int first, int last) {
    (void)first, (void)last;
    return false;
  }
  // Bytes this backend may hold on its device, weights, caches and activations together (--gpu-mem-limit; 0: what
  // the device has free); called before load. A device backend then refuses weights and prompts beyond it as it
  // would on a card of that size; by default nothing is limited.
  virtual void set_memory_limit(int64_t bytes) { (void)bytes; }
  // Stream(l)'s row r0 onwards of the last forward (l in [first, last]; rows contiguous, hidden f32 each), where it
  // lives: device < 0 host memory, else that GPU's. Valid until the next forward.
  struct StreamRows {
    const float* data = nullptr;
    int device = -1;
  };
  virtual StreamRows stream_rows(int l, int64_t r0) const {
    (void)l, (void)r0;
    return {};
  }
  // Overwrites rows [r0, r0 + rows) of Stream(l) with host or device memory (the split's logit lens: another
  // block's row through this block's final norm and LM head).
  virtual void write_stream(int l, int64_t r0, int64_t rows, const float* in) {
    (void)l, (void)r0, (void)rows, (void)in;
  }
  // Rows [r0, r0 + rows) of Stream(l) into host memory.
  virtual void read_stream(int l, int64_t r0, int64_t rows, float* out) {
    (void)l, (void)r0, (void)rows, (void)out;
  }
};

}  // namespace ds
