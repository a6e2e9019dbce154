// The Python module's native part, diffscope._diffscope (nanobind): the engine's Session, its map queries, the
// profiler, generation and corpus scans, with results as NumPy arrays over the engine's own buffers and, on the
// CUDA backend, DLPack device arrays. The package diffscope (python/diffscope/__init__.py) wraps it in the public
// API; the names here that start with an underscore are for that wrapper.
//
// Rules of the binding layer:
// - every engine call releases the GIL and holds the session's mutex, so a second Python thread waits instead of
//   racing on the session; a closed session refuses every call with diffscope.Error;
// - Ctrl-C during long work (a forward, a scan's prompt) stops it at the engine's next cancellation point: the
//   engine throws ds::Cancelled, the session stays usable, and Python gets KeyboardInterrupt;
// - ds::Error (and bad_alloc) become diffscope.Error with the engine's one-line message; wrong Python types are
//   nanobind's TypeError; nothing here trusts an index the engine has not checked.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/map_query.h"
#include "engine/session/backends.h"
#include "engine/session/session.h"
#include "engine/session/session_importance.h"
#include "engine/session/session_lens.h"
#include "engine/session/session_outliers.h"
#include "engine/session/session_quantize.h"
#include "engine/session/session_scan.h"
#include "engine/session/session_scan_replicas.h"
#include "engine/cuda/backend_cuda.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Ctrl-C while the GIL is released: Python's own handler only sets a flag that the interpreter reads later, so
// during engine work a handler of ours sets a flag the engine's cancel predicate reads (from any thread), and the
// previous handler comes back afterwards. Only the main thread installs it (signals go to the main thread).

std::atomic<bool> g_sigint{false};
extern "C" void on_sigint(int) { g_sigint.store(true); }

class InterruptScope {
 public:
  InterruptScope() {
    g_sigint.store(false);
    if (PyGILState_Check() && PyThread_get_thread_ident() == main_thread_) {
      struct sigaction sa {};
      sa.sa_handler = on_sigint;
      sigemptyset(&sa.sa_mask);
      installed_ = sigaction(SIGINT, &sa, &old_) == 0;
    }
  }
  // A Ctrl-C that no cancellation took (the call was not cancellable, or finished first) goes to Python's handler,
  // which raises KeyboardInterrupt at the interpreter's next check: no Ctrl-C is lost.
  ~InterruptScope() {
    if (!installed_) return;
    sigaction(SIGINT, &old_, nullptr);
    if (g_sigint.exchange(false)) raise(SIGINT);
  }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  static bool hit() { return g_sigint.load(std::memory_order_relaxed); }
  static void consume() { g_sigint.store(false); }  // the cancellation raised KeyboardInterrupt itself
  static void set_main_thread() { main_thread_ = PyThread_get_thread_ident(); }

 private:
  struct sigaction old_ {};
  bool installed_ = false;
  static inline unsigned long main_thread_ = 0;
};

[[noreturn]] void raise_keyboard_interrupt() {
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  throw nb::python_error();
}

// ---------------------------------------------------------------------------------------------------------------
// arrays

// A NumPy array that owns `v`'s buffer: the vector is moved to the heap and freed with the array (no copy).
template <class T>
nb::ndarray<nb::numpy, T> owned(std::vector<T>&& v, std::vector<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape.size(), shape.data(), owner);
}

// A NumPy array over memory that `owner` (a Python object) keeps alive.
template <class T>
nb::ndarray<nb::numpy, T> viewed(T* data, std::vector<size_t> shape, nb::handle owner) {
  return nb::ndarray<nb::numpy, T>(data, shape.size(), shape.data(), owner);
}

// A DLPack array (an object with __dlpack__ and __dlpack_device__, which torch.from_dlpack and cupy.from_dlpack
// take) on CUDA device `device` over part of `mem`, which the array keeps alive.
nb::ndarray<nb::array_api, float> device_array(const std::shared_ptr<ds::DeviceFloats>& mem, size_t offset_floats,
                                std::vector<size_t> shape) {
  auto* hold = new std::shared_ptr<ds::DeviceFloats>(mem);
  nb::capsule owner(hold, [](void* p) noexcept { delete static_cast<std::shared_ptr<ds::DeviceFloats>*>(p); });
  return nb::ndarray<nb::array_api, float>(mem->data + offset_floats, shape.size(), shape.data(), owner, nullptr,
                                           nb::dtype<float>(), nb::device::cuda::value, mem->device);
}

// One array of a result (View, Rows, Maps): on the GPU the slot-th of its equal-sized device arrays (slot 0: a1,
// 1: a2, 2: diff), else the engine's host buffer viewed with the result object as owner.
nb::object result_array(nb::handle self, const std::shared_ptr<ds::DeviceFloats>& dev, size_t slot, float* host,
                        std::vector<size_t> shape) {
  if (dev) {
    size_t count = 1;
    for (size_t d : shape) count *= d;
    return nb::cast(device_array(dev, slot * count, std::move(shape)));
  }
  return nb::cast(viewed(host, std::move(shape), self));
}

// A1 - lambda * A2 as a new host array, one lambda for each block of `block` values (a layer's rows; a whole map).
nb::object diff_array(const std::vector<float>& a1, const std::vector<float>& a2, const std::vector<float>& lambdas,
                      size_t block, std::vector<size_t> shape) {
  std::vector<float> d(a1.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = a1[i] - lambdas[i / block] * a2[i];
  return nb::cast(owned(std::move(d), std::move(shape)));
}

// ---------------------------------------------------------------------------------------------------------------
// Host grids of views given back when their View is freed. A loop of views (a notebook's slider, a sweep) then
// reuses pages already mapped and sized, as the programs reuse one MapView, instead of paying fresh pages (a page
// fault per 4 KB) and their zero-fill on every call: a 1024 x 1024 view is 12 MB of grids. Bounded; thread-safe.
class GridPool {
 public:
  static GridPool& get() {
    static GridPool* p = new GridPool;  // never destroyed: Views may be freed during interpreter shutdown
    return *p;
  }
  // A vector with room for `cells` (its size is left as it was: the backend's resize fills only what is new).
  std::vector<float> take(size_t cells) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].capacity() >= cells && free_[i].capacity() <= 2 * cells + 4096) {
        std::vector<float> v = std::move(free_[i]);
        free_.erase(free_.begin() + std::ptrdiff_t(i));
        bytes_ -= v.capacity() * sizeof(float);
        return v;
      }
    return {};
  }
  void give(std::vector<float>&& v) {
    const size_t b = v.capacity() * sizeof(float);
    if (b == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_ + b > kMaxBytes || free_.size() >= kMaxGrids) return;  // freed with v
    bytes_ += b;
    free_.push_back(std::move(v));
  }

 private:
  static constexpr size_t kMaxBytes = size_t(96) << 20, kMaxGrids = 12;
  std::mutex mu_;
  std::vector<std::vector<float>> free_;
  size_t bytes_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// results held by Python objects, their arrays viewing the engine's buffers

struct View {
  ds::MapView v;
  std::shared_ptr<ds::DeviceFloats> dev;  // device=True: [3, rows, cols] a1, a2, diff
  bool implicit = false;                      // a Mamba channel's implicit attention (mamba_view)
  View() = default;
  View(const View&) = default;
  View& operator=(const View&) = default;
  ~View() {
    for (std::vector<float>* g : {&v.a1, &v.a2, &v.diff}) GridPool::get().give(std::move(*g));
  }
  std::vector<size_t> shape() const { return {size_t(v.rows), size_t(v.cols)}; }
};

struct Rows {
  std::vector<int64_t> layers;
  std::vector<int64_t> positions;
  int64_t heads = 0, n = 0;
  bool differential = false;
  std::vector<float> lambdas;                 // [layers]: each layer's lambda
  std::vector<float> head_lambdas;            // [layers, heads]: the lambda of each head's diff (Session::head_lambda)
  std::vector<float> a1, a2;                  // [layers, heads, P, n]
  std::shared_ptr<ds::DeviceFloats> dev;  // device=True: a1 then a2
  std::vector<size_t> shape() const { return {layers.size(), size_t(heads), positions.size(), size_t(n)}; }
};

struct Maps {
  int layer = 0;
  float lambda = 0;
  std::vector<float> head_lambdas;  // [heads]: the lambda of each head's diff (Session::head_lambda)
  bool differential = false;
  ds::LayerMaps m;
  std::shared_ptr<ds::DeviceFloats> dev;  // device=True: a1 then a2
  std::vector<size_t> shape() const { return {size_t(m.heads), size_t(m.n), size_t(m.n)}; }
};

// ---------------------------------------------------------------------------------------------------------------
// the session

class PySession {
 public:
  PySession(const std::string& path, const std::string& backend, int threads, int64_t gpu_mem_limit,
            int64_t plan_tokens) {
    if (threads < 0) throw ds::Error("threads: " + std::to_string(threads) + " is negative (0: every core)");
    if (gpu_mem_limit < 0) throw ds::Error("gpu_mem_limit: " + std::to_string(gpu_mem_limit) + " is negative");
    if (plan_tokens < 0) throw ds::Error("plan_tokens: " + std::to_string(plan_tokens) + " is negative (0: 4096)");
    const std::vector<ds::BackendChoice> choices = ds::parse_backend_list(backend);
    device_ = choices[0].device;
    nb::gil_scoped_release nogil;
    s_ = ds::Session::open(path, choices, nullptr, threads, gpu_mem_limit, plan_tokens);
  }
  // The CUDA device index the session was opened on; device arrays need the model on one GPU.
  int device() const {
    if (s_ && s_->backend().devices_used() > 1)
      throw ds::Error("device=True on a model split over several GPUs is not built: take the host arrays (device=False)");
    return device_;
  }

  // Runs f(session) without the GIL and with the session's lock; Ctrl-C cancels through `cancel()`.
  template <class F>
  auto call(F&& f) -> decltype(f(std::declval<ds::Session&>())) {
    if (!s_) throw ds::Error("the session is closed");
    InterruptScope ctrl_c;
    try {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      if (!s_) throw ds::Error("the session is closed");
      return f(*s_);
    } catch (const ds::Cancelled&) {
      if (InterruptScope::hit()) {
        InterruptScope::consume();
        raise_keyboard_interrupt();
      }
      throw;
    }
  }
  static bool cancel() { return InterruptScope::hit(); }

  void close() {
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    s_.reset();
  }
  bool closed() const { return !s_; }
  ds::Session& unsafe() {  // for reads of immutable state (config) with the GIL held
    if (!s_) throw ds::Error("the session is closed");
    return *s_;
  }

 private:
  std::unique_ptr<ds::Session> s_;
  std::mutex mu_;
  int device_ = 0;
};

void check_layer(const ds::ModelConfig& c, int64_t layer, const char* what) {
  if (layer < 0 || layer >= c.layers)
    throw ds::Error(std::string(what) + ": layer " + std::to_string(layer) + " does not exist (the model has " +
                    std::to_string(c.layers) + " layers)");
}

void need_result(ds::Session& s) {
  if (!s.has_result()) throw ds::Error("no result yet: call run() first");
}

void need_cuda(ds::Session& s, const char* what) {
  if (s.backend().kind() != "cuda")
    throw ds::Error(std::string(what) + ": device=True needs the CUDA backend; this session runs on " +
                    s.backend().name());
}

ds::Pool parse_pool(const std::string& p) {
  if (p == "max") return ds::Pool::Max;
  if (p == "mean") return ds::Pool::Mean;
  throw ds::Error("pool: '" + p + "' is not one of max, mean");
}

nb::dict config_dict(const ds::Session& s) {
  const ds::ModelConfig& c = s.config();
  nb::dict d;
  d["architecture"] = std::string(c.spec().architecture);
  d["family"] = std::string(c.family());
  d["model_type"] = c.model_type;
  d["differential"] = c.is_diff();
  d["layers"] = c.layers;
  d["hidden"] = c.hidden;
  d["heads"] = c.heads;
  d["view_heads"] = c.view_heads();
  d["kv_heads"] = c.kv_heads;
  d["head_dim"] = c.head_dim;
  d["intermediate"] = c.intermediate;
  d["vocab"] = c.vocab;
  d["max_positions"] = c.max_positions;
  d["params"] = c.params();
  d["dtype"] = c.dtype;
  nb::list kinds, labels;
  for (int64_t l = 0; l < c.layers; ++l) {
    kinds.append(std::string(ds::layer_kind_name(c.kind(l))));
    labels.append(c.layer_label(l));
  }
  d["layer_kinds"] = kinds;
  d["layer_labels"] = labels;
  nb::list maps;
  for (int64_t l : c.map_layers()) maps.append(l);
  d["map_layers"] = maps;
  d["eos_ids"] = s.eos_ids();
  return d;
}

// ---------------------------------------------------------------------------------------------------------------
// corpus scans: one or two runs (a comparison) over prompts given one at a time

class PyScan {
 public:
  PyScan(PySession& a, PySession* b, const std::string& label, double lambda_scale, std::optional<double> compare_scale,
         const std::string& compare_label, int max_answer_tokens, bool outliers, int logit_bits)
      : a_(a), b_(b) {
    if (max_answer_tokens < 1)
      throw ds::Error("max_answer_tokens: " + std::to_string(max_answer_tokens) + " must be at least 1");
    runs_.push_back(std::make_unique<ds::scan::Run>(a.unsafe(), ds::scan::RunOptions{label, lambda_scale, max_answer_tokens, outliers, logit_bits}));
    if (b || compare_scale)
      runs_.push_back(std::make_unique<ds::scan::Run>(
          b ? b->unsafe() : a.unsafe(),
          ds::scan::RunOptions{compare_label, compare_scale.value_or(1.0), max_answer_tokens, outliers, logit_bits}));
    t0_ = std::chrono::steady_clock::now();
  }
  PyScan(const PyScan&) = delete;
  PyScan& operator=(const PyScan&) = delete;

  // A corpus file as diffscope-scan reads it (engine/session/session_scan.h read_corpus): its bad lines are
  // recorded as skipped; returns the number of prompts, which run(i) then scans one at a time.
  size_t load(const std::string& path) {
    ds::scan::Corpus c = ds::scan::read_corpus(path);
    for (const ds::scan::LineError& e : c.errors) skipped_.push_back(e);
    loaded_ = std::move(c.prompts);
    return loaded_.size();
  }
  std::optional<std::string> run_loaded(size_t i) {
    if (i >= loaded_.size()) throw ds::Error("scan: prompt " + std::to_string(i) + " was not loaded");
    return scan(loaded_[i]);
  }
  // One corpus line (a JSON object's text). Returns None when it ran, the one-line reason when it was skipped.
  std::optional<std::string> add(const std::string& line, int line_no) {
    ds::scan::Prompt p;
    try {
      p = ds::scan::parse_line(line, line_no);
    } catch (const ds::Error& e) {
      skipped_.push_back({line_no, e.what()});
      return std::string(e.what());
    }
    return scan(p);
  }
  std::optional<std::string> scan(const ds::scan::Prompt& p) {
    const int line_no = p.line;
    try {
      a_.call([&](ds::Session&) {
        if (b_ && b_->closed()) throw ds::Error("the compared session is closed");
        ds::scan::scan_all(runs_, p, &PySession::cancel);
        return 0;
      });
    } catch (const ds::Cancelled&) {
      throw;
    } catch (const ds::Error& e) {
      skipped_.push_back({line_no, e.what()});
      return std::string(e.what());
    }
    return std::nullopt;
  }
  void skip(int line_no, const std::string& why) { skipped_.push_back({line_no, why}); }

  std::string report_json(const std::string& input, bool complete) const {
    std::vector<const ds::scan::Run*> views;
    for (const auto& r : runs_) views.push_back(r.get());
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    return ds::scan::report_json(ds::scan::make_report(views, input, skipped_, complete, elapsed))
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  size_t scanned() const { return runs_[0]->results().size(); }

 private:
  PySession& a_;
  PySession* b_;
  std::vector<ds::scan::Prompt> loaded_;
  std::vector<std::unique_ptr<ds::scan::Run>> runs_;
  std::vector<ds::scan::LineError> skipped_;
  std::chrono::steady_clock::time_point t0_;
};

// A scan on several replicas (engine/session/session_scan_replicas.h): the models opened once per backend of the list,
// the prompts (a file, or JSON lines) handed to whichever replica is free. Returns the report's JSON and whether
// Ctrl-C stopped it; progress(done, total) is called (with the GIL) as prompts finish.
nb::tuple replica_scan(const std::string& model, const std::string& compare, const std::string& backend, int threads,
                       const std::string& label, double lambda_scale, std::optional<double> compare_scale,
                       const std::string& compare_label, int max_answer_tokens, bool outliers, int logit_bits,
                       const std::string& source, const std::vector<std::string>& lines, std::optional<int> max_prompts,
                       nb::object progress) {
  if (max_answer_tokens < 1)
    throw ds::Error("max_answer_tokens: " + std::to_string(max_answer_tokens) + " must be at least 1");
  ds::scan::Corpus corpus;
  if (lines.empty()) {
    corpus = ds::scan::read_corpus(source);
  } else {
    for (size_t i = 0; i < lines.size(); ++i) {
      try {
        corpus.prompts.push_back(ds::scan::parse_line(lines[i], int(i) + 1));
      } catch (const ds::Error& e) {
        corpus.errors.push_back({int(i) + 1, e.what()});
      }
    }
  }
  const size_t available = corpus.prompts.size();
  if (max_prompts && size_t(*max_prompts) < corpus.prompts.size()) corpus.prompts.resize(size_t(*max_prompts));
  ds::scan::ReplicaScanOptions ro;
  ro.model = model;
  ro.compare_model = compare;
  ro.backends = ds::parse_backend_list(backend);
  ro.threads = threads;
  ro.first = ds::scan::RunOptions{label, lambda_scale, max_answer_tokens, outliers, logit_bits};
  if (!compare.empty() || compare_scale)
    ro.second = ds::scan::RunOptions{compare_label, compare_scale.value_or(1.0), max_answer_tokens, outliers, logit_bits};
  std::unique_ptr<ds::scan::ReplicaScan> rs;
  {
    nb::gil_scoped_release nogil;
    rs = std::make_unique<ds::scan::ReplicaScan>(ro);
  }
  std::vector<ds::scan::LineError> skipped = corpus.errors;
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  std::string callback_error;
  bool all = false;
  {
    InterruptScope ctrl_c;
    nb::gil_scoped_release nogil;
    all = rs->run(corpus.prompts, [&] { return InterruptScope::hit() || !callback_error.empty(); },
                  [&](const ds::scan::Prompt& p, const ds::scan::PromptResult*, const std::string* err) {
                    if (err) skipped.push_back({p.line, *err});
                    ++done;
                    if (progress.is_none()) return;
                    nb::gil_scoped_acquire gil;
                    try {
                      progress(done, corpus.prompts.size());
                    } catch (nb::python_error& e) {
                      callback_error = e.what();  // stops the scan; raised below
                    }
                  });
  }
  if (!callback_error.empty()) throw std::runtime_error("scan: the progress callback raised: " + callback_error);
  const bool interrupted = !all;
  if (interrupted) InterruptScope::consume();  // the partial report comes back (a warning), not an exception
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool complete = all && corpus.prompts.size() == available && rs->scanned() > 0;
  const std::string j = ds::scan::report_json(rs->report(lines.empty() ? source : "<python>", skipped, complete, elapsed))
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return nb::make_tuple(j, interrupted, rs->scanned());
}

}  // namespace

NB_MODULE(_diffscope, m) {
  m.doc() = "diffscope's engine (native part). Use the package: import diffscope.";
  InterruptScope::set_main_thread();

  static nb::exception<ds::Error> error(m, "Error");
  error.doc() = "An error a caller can cause (a file, a prompt, an argument): one line naming it and the problem.";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::bad_alloc&) {
      PyErr_SetString(error.ptr(), "out of host memory (try a shorter prompt, a smaller view or the other backend)");
    }
  });

  m.def("cuda_available", [] { return ds::cuda_device_count() > 0; },
        "True when this build has the CUDA backend and a usable NVIDIA GPU (compute capability 8.0+) is present.");
  m.def("cuda_device_count", [] { return ds::cuda_device_count(); },
        "Usable NVIDIA GPUs (0 without the CUDA backend or a driver).");
  m.def("cuda_built", [] {
#ifdef DS_HAVE_CUDA
    return true;
#else
    return false;
#endif
  }, "True when this build of the module has the CUDA backend (a GPU may still be missing: cuda_available()).");

  nb::class_<View>(m, "View", "A pooled view of one head's maps (Session.view) or of a Mamba channel (mamba_view).")
      .def_prop_ro("a1", [](nb::handle self) {
        View& v = nb::cast<View&>(self);
        return result_array(self, v.dev, 0, v.v.a1.data(), v.shape());
      }, "[rows, cols] map 1 (the only map of a plain head; a Mamba channel's implicit map)")
      .def_prop_ro("a2", [](nb::handle self) {
        View& v = nb::cast<View&>(self);
        return v.v.differential ? result_array(self, v.dev, 1, v.v.a2.data(), v.shape()) : nb::none();
      }, "[rows, cols] map 2, or None for a plain (single-softmax) head")
      .def_prop_ro("diff", [](nb::handle self) {
        View& v = nb::cast<View&>(self);
        return result_array(self, v.dev, 2, v.v.diff.data(), v.shape());
      }, "[rows, cols] A1 - lambda * A2 (equal to a1 for a plain head)")
      .def_prop_ro("layer", [](const View& v) { return v.v.layer; })
      .def_prop_ro("head", [](const View& v) { return v.v.head; }, "the view head (a channel for mamba_view)")
      .def_prop_ro("rect", [](const View& v) { return std::make_tuple(v.v.q0, v.v.q1, v.v.k0, v.v.k1); },
                   "(q0, q1, k0, k1) after clamping to the sequence")
      .def_prop_ro("grid", [](const View& v) { return std::make_pair(v.v.rows, v.v.cols); },
                   "(rows, cols) after capping at the rectangle's extent")
      .def_prop_ro("pool", [](const View& v) { return std::string(v.v.pool == ds::Pool::Max ? "max" : "mean"); })
      .def_prop_ro("lambda_", [](const View& v) { return v.v.lambda; }, "the lambda of diff (0 for plain heads)")
      .def_prop_ro("differential", [](const View& v) { return v.v.differential; })
      .def_prop_ro("on_device", [](const View& v) { return bool(v.dev); })
      .def("_engine_address", [](const View& v, const std::string& which) -> uintptr_t {
        const std::vector<float>& x = which == "a1" ? v.v.a1 : which == "a2" ? v.v.a2 : v.v.diff;
        if (v.dev) return uintptr_t(v.dev->data);
        return uintptr_t(x.data());
      }, "where the engine wrote the grid (tests: the arrays are not copies)")
      .def("__repr__", [](const View& v) {
        return "<diffscope.View layer " + std::to_string(v.v.layer) + (v.implicit ? " channel " : " head ") +
               std::to_string(v.v.head) + " rect (" + std::to_string(v.v.q0) + ", " + std::to_string(v.v.q1) + ", " +
               std::to_string(v.v.k0) + ", " + std::to_string(v.v.k1) + ") grid " + std::to_string(v.v.rows) + "x" +
               std::to_string(v.v.cols) + (v.dev ? " on the GPU>" : ">");
      });

  nb::class_<Rows>(m, "Rows", "Exact attention rows of chosen query positions, every head of the chosen layers.")
      .def_prop_ro("a1", [](nb::handle self) {
        Rows& r = nb::cast<Rows&>(self);
        return result_array(self, r.dev, 0, r.a1.data(), r.shape());
      }, "[layers, heads, positions, n] map 1")
      .def_prop_ro("a2", [](nb::handle self) {
        Rows& r = nb::cast<Rows&>(self);
        return r.differential ? result_array(self, r.dev, 1, r.a2.data(), r.shape()) : nb::none();
      }, "[layers, heads, positions, n] map 2, or None for a plain model")
      .def_prop_ro("diff", [](nb::handle self) {
        Rows& r = nb::cast<Rows&>(self);
        if (!r.differential) return result_array(self, r.dev, 0, r.a1.data(), r.shape());
        if (r.dev)
          throw ds::Error("rows: diff of device rows is not formed on the GPU; take a1 - lambda_ * a2 there (torch, cupy)");
        return diff_array(r.a1, r.a2, r.head_lambdas, r.positions.size() * size_t(r.n), r.shape());
      }, "[layers, heads, positions, n] A1 - head_lambda * A2 per head (a new array; a1 itself for a plain model)")
      .def_prop_ro("lambda_", [](const Rows& r) {
        std::vector<float> v = r.lambdas;
        const size_t L = v.size();
        return owned(std::move(v), {L});
      }, "[layers] each layer's lambda (0 for plain models)", nb::rv_policy::automatic)
      .def_prop_ro("head_lambda", [](const Rows& r) {
        std::vector<float> v = r.head_lambdas;
        const size_t L = r.layers.size(), H = size_t(r.heads);
        return owned(std::move(v), {L, H});
      }, "[layers, heads] the lambda of each head's diff: the layer's, or the head's own (set_head_lambda; 0 with "
         "A2 dropped); 0 for plain models", nb::rv_policy::automatic)
      .def_prop_ro("layers", [](const Rows& r) { return r.layers; })
      .def_prop_ro("positions", [](const Rows& r) { return r.positions; }, "resolved (negative ones counted from the end)")
      .def_prop_ro("differential", [](const Rows& r) { return r.differential; })
      .def_prop_ro("on_device", [](const Rows& r) { return bool(r.dev); })
      .def("_engine_address", [](const Rows& r, const std::string& which) -> uintptr_t {
        if (r.dev) return uintptr_t(r.dev->data);
        return uintptr_t(which == "a2" ? r.a2.data() : r.a1.data());
      });

  nb::class_<Maps>(m, "Maps", "A layer's full maps [heads, n, n] (O(n^2): small prompts).")
      .def_prop_ro("a1", [](nb::handle self) {
        Maps& x = nb::cast<Maps&>(self);
        return result_array(self, x.dev, 0, x.m.a1.data(), x.shape());
      }, "[heads, n, n] map 1")
      .def_prop_ro("a2", [](nb::handle self) {
        Maps& x = nb::cast<Maps&>(self);
        return x.differential ? result_array(self, x.dev, 1, x.m.a2.data(), x.shape()) : nb::none();
      }, "[heads, n, n] map 2, or None for a plain model")
      .def_prop_ro("diff", [](nb::handle self) {
        Maps& x = nb::cast<Maps&>(self);
        if (!x.differential) return result_array(self, x.dev, 0, x.m.a1.data(), x.shape());
        if (x.dev)
          throw ds::Error("maps: diff of device maps is not formed on the GPU; take a1 - lambda_ * a2 there (torch, cupy)");
        return diff_array(x.m.a1, x.m.a2, x.head_lambdas, size_t(x.m.n) * size_t(x.m.n), x.shape());
      }, "[heads, n, n] A1 - head_lambda * A2 per head (a new array; a1 itself for a plain model)")
      .def_prop_ro("layer", [](const Maps& x) { return x.layer; })
      .def_prop_ro("lambda_", [](const Maps& x) { return x.lambda; }, "the layer's lambda in the run")
      .def_prop_ro("head_lambda", [](const Maps& x) {
        std::vector<float> v = x.head_lambdas;
        const size_t H = v.size();
        return owned(std::move(v), {H});
      }, "[heads] the lambda of each head's diff: the layer's, or the head's own (set_head_lambda; 0 with A2 "
         "dropped); 0 for plain models", nb::rv_policy::automatic)
      .def_prop_ro("differential", [](const Maps& x) { return x.differential; })
      .def_prop_ro("on_device", [](const Maps& x) { return bool(x.dev); })
      .def("_engine_address", [](const Maps& x, const std::string& which) -> uintptr_t {
        if (x.dev) return uintptr_t(x.dev->data);
        return uintptr_t(which == "a2" ? x.m.a2.data() : x.m.a1.data());
      });

  nb::class_<PySession>(m, "_Session")
      .def(nb::init<const std::string&, const std::string&, int, int64_t, int64_t>(), "path"_a, "backend"_a = "auto",
           "threads"_a = 0, "gpu_mem_limit"_a = 0, "plan_tokens"_a = 0)
      .def("close", &PySession::close)
      .def_prop_ro("closed", &PySession::closed)
      .def_prop_ro("config", [](PySession& ps) { return config_dict(ps.unsafe()); })
      .def_prop_ro("model_dir", [](PySession& ps) { return ps.unsafe().model_dir(); })
      .def_prop_ro("backend_name", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.backend().name(); }); })
      .def_prop_ro("backend_kind", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.backend().kind(); }); })
      .def_prop_ro("has_tokenizer", [](PySession& ps) { return ps.unsafe().tokenizer() != nullptr; })
      .def_prop_ro("tokenizer_error", [](PySession& ps) { return ps.unsafe().tokenizer_error(); })
      .def("encode", [](PySession& ps, const std::string& text, bool add_special) {
        return ps.call([&](ds::Session& s) {
          if (!s.tokenizer()) throw ds::Error("no tokenizer: " + s.tokenizer_error());
          return s.tokenizer()->encode(text, add_special);
        });
      }, "text"_a, "add_special"_a = true)
      .def("decode", [](PySession& ps, const std::vector<int32_t>& ids) {
        return ps.call([&](ds::Session& s) {
          if (!s.tokenizer()) throw ds::Error("no tokenizer: " + s.tokenizer_error());
          for (int32_t id : ids)
            if (id < 0 || id >= s.config().vocab)
              throw ds::Error("id " + std::to_string(id) + " is outside the vocabulary (" +
                              std::to_string(s.config().vocab) + " tokens)");
          return s.tokenizer()->decode(ids);
        });
      }, "ids"_a)
      .def("set_prompt", [](PySession& ps, const std::string& text) {
        ps.call([&](ds::Session& s) { s.set_prompt(text); return 0; });
      })
      .def("set_ids", [](PySession& ps, const std::vector<int32_t>& ids) {
        ps.call([&](ds::Session& s) { s.set_ids(ids); return 0; });
      })
      .def("run", [](PySession& ps, bool all_logits) {
        return ps.call([&](ds::Session& s) { return s.run(all_logits, &PySession::cancel, true); });
      }, "all_logits"_a = false)
      .def_prop_ro("stale_from", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.stale_from(); }); })
      .def_prop_ro("has_result", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.has_result(); }); })
      .def("nonfinite_logits", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.nonfinite_logits(); }); })
      .def_prop_ro("ids", [](PySession& ps) {
        std::vector<int32_t> ids = ps.call([](ds::Session& s) { return s.ids(); });
        const size_t n = ids.size();
        return owned(std::move(ids), {n});
      }, nb::rv_policy::automatic)
      .def_prop_ro("token_spans", [](PySession& ps) {
        return ps.call([](ds::Session& s) {
          std::vector<std::tuple<int32_t, std::string, size_t, size_t, bool>> out;
          for (const ds::TokenSpan& t : s.tokens()) out.emplace_back(t.id, t.text, t.begin, t.end, t.special);
          return out;
        });
      })
      .def_prop_ro("prompt_length", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.prompt_length(); }); })
      .def("top_k", [](PySession& ps, int k) {
        if (k < 1) throw ds::Error("top_k: k = " + std::to_string(k) + " must be at least 1");
        return ps.call([&](ds::Session& s) {
          need_result(s);
          std::vector<std::tuple<int32_t, float, float, std::string>> out;
          for (const ds::TopToken& t : s.top_k(k)) out.emplace_back(t.id, t.prob, t.logit, t.text);
          return out;
        });
      }, "k"_a)
      .def("logits", [](PySession& ps, bool all_positions) {
        std::pair<std::vector<float>, int64_t> r = ps.call([&](ds::Session& s) {
          need_result(s);
          if (all_positions) s.run(true, &PySession::cancel, true);
          const ds::ForwardResult& res = s.result();
          const int64_t V = s.config().vocab;
          if (all_positions) return std::make_pair(res.logits, res.logit_rows);
          return std::make_pair(std::vector<float>(res.logits.end() - V, res.logits.end()), int64_t(1));
        });
        const size_t V = r.first.size() / size_t(std::max<int64_t>(1, r.second));
        if (!all_positions) return owned(std::move(r.first), {V});
        return owned(std::move(r.first), {size_t(r.second), V});
      }, "all_positions"_a = false)
      .def("next_token_logprobs", [](PySession& ps) {
        std::vector<float> lp = ps.call([](ds::Session& s) {
          need_result(s);
          return s.next_token_logprobs();
        });
        const size_t V = lp.size();
        return owned(std::move(lp), {V});
      })
      // lambda
      .def("lambdas", [](PySession& ps) {
        return ps.call([](ds::Session& s) {
          const int64_t L = s.config().layers;
          std::vector<double> model(static_cast<size_t>(L)), eff(static_cast<size_t>(L));
          std::vector<std::optional<double>> over(static_cast<size_t>(L));
          for (int l = 0; l < L; ++l) {
            model[size_t(l)] = s.model_lambda(l);
            eff[size_t(l)] = s.effective_lambda(l);
            if (size_t(l) < s.lambda_control().override_.size()) over[size_t(l)] = s.lambda_control().override_[size_t(l)];
          }
          return std::make_tuple(model, eff, over, s.lambda_control().scale);
        });
      })
      .def("set_lambda", [](PySession& ps, int64_t layer, std::optional<double> value) {
        ps.call([&](ds::Session& s) {
          const ds::ModelConfig& c = s.config();
          if (!c.is_diff())
            throw ds::Error(std::string("set_lambda: lambda applies to differential models; this is a ") + c.family() +
                            " model");
          check_layer(c, layer, "set_lambda");
          if (!c.has_maps(layer)) throw ds::Error("set_lambda: " + c.no_attention(layer, "lambda"));
          if (value && !std::isfinite(*value)) throw ds::Error("set_lambda: the value must be a finite number");
          s.set_lambda_override(int(layer), value);
          return 0;
        });
      }, "layer"_a, "value"_a.none())
      .def("set_lambda_scale", [](PySession& ps, double x) {
        ps.call([&](ds::Session& s) {
          if (!std::isfinite(x)) throw ds::Error("lambda_scale: the value must be a finite number");
          if (!s.config().is_diff())
            throw ds::Error(std::string("lambda_scale: lambda applies to differential models; this is a ") +
                            s.config().family() + " model");
          s.set_lambda_scale(x);
          return 0;
        });
      })
      .def("reset_lambda", [](PySession& ps) { ps.call([](ds::Session& s) { s.reset_lambda(); return 0; }); })
      // maps
      .def("maps", [](PySession& ps, int64_t layer, bool device, double max_bytes) {
        auto out = std::make_unique<Maps>();
        ps.call([&](ds::Session& s) {
          need_result(s);
          const ds::ModelConfig& c = s.config();
          check_layer(c, layer, "maps");
          if (!c.has_maps(layer)) throw ds::Error("maps: " + c.no_attention(layer, "attention maps"));
          const double n = double(s.ids().size());
          const double bytes = double(c.view_heads()) * (c.is_diff() ? 2.0 : 1.0) * n * n * 4.0;
          if (bytes > max_bytes)
            throw ds::Error("maps: layer " + std::to_string(layer) + "'s maps of " + std::to_string(int64_t(n)) +
                            " tokens take " + std::to_string(int64_t(bytes / 1e6)) + " MB, above max_bytes (" +
                            std::to_string(int64_t(max_bytes / 1e6)) + " MB): raise it, or ask view() or rows()");
          out->layer = int(layer);
          out->differential = c.is_diff();
          out->lambda = c.is_diff() ? float(s.effective_lambda(int(layer))) : 0.f;
          for (int h = 0; h < int(c.view_heads()); ++h)
            out->head_lambdas.push_back(c.is_diff() ? float(s.head_lambda(int(layer), h)) : 0.f);
          if (device) {
            need_cuda(s, "maps");
            const size_t per = size_t(c.view_heads()) * size_t(n) * size_t(n);
            out->dev = ds::cuda_device_floats(per * (c.is_diff() ? 2 : 1), ps.device());
            out->m.device_out1 = out->dev->data;
            out->m.device_out2 = c.is_diff() ? out->dev->data + per : nullptr;
          }
          s.backend().layer_maps(int(layer), out->m);
          return 0;
        });
        return out.release();
      }, "layer"_a, "device"_a = false, "max_bytes"_a = 1e9, nb::rv_policy::take_ownership)
      .def("view", [](PySession& ps, int layer, int head, int rows, int cols, int64_t q0, int64_t q1, int64_t k0,
                      int64_t k1, const std::string& pool, std::optional<float> lambda, bool device, bool mamba) {
        auto out = std::make_unique<View>();
        out->implicit = mamba;
        ds::ViewRequest q;
        q.layer = layer, q.head = head, q.rows = rows, q.cols = cols;
        q.q0 = q0, q.q1 = q1, q.k0 = k0, q.k1 = k1;
        q.pool = parse_pool(pool);
        if (lambda && !std::isfinite(*lambda)) throw ds::Error("view: lambda must be a finite number");
        q.lambda = lambda;
        ps.call([&](ds::Session& s) {
          need_result(s);
          const ds::ModelConfig& c = s.config();
          const int64_t n = int64_t(s.ids().size());
          if (!mamba && layer >= 0 && layer < c.layers && !c.has_maps(layer))
            throw ds::Error("view: " + c.no_attention(layer, "attention maps") +
                            (c.has_scan(layer) ? " (mamba_view shows its implicit attention)" : ""));
          ds::ViewRequest shape_q = q;  // the grid after capping, to size the arrays (nothing allocated)
          shape_q.device_out = reinterpret_cast<float*>(1);
          ds::MapView probe;
          if (mamba) ds::prepare_mamba_view(shape_q, c, n, probe, false);
          else ds::prepare_view(shape_q, int(c.layers), int(c.view_heads()), n, c.is_diff(), 0.f, probe, false);
          const size_t cells = size_t(probe.rows) * size_t(probe.cols);
          if (device) {
            need_cuda(s, mamba ? "mamba_view" : "view");
            out->dev = ds::cuda_device_floats(3 * cells, ps.device());
            q.device_out = out->dev->data;
          } else {
            out->v.a1 = GridPool::get().take(cells);
            if (c.is_diff() && !mamba) out->v.a2 = GridPool::get().take(cells);
            out->v.diff = GridPool::get().take(cells);
          }
          if (mamba) s.backend().mamba_view(q, out->v);
          else s.backend().map_view(q, out->v);
          return 0;
        });
        return out.release();
      }, "layer"_a, "head"_a, "rows"_a, "cols"_a, "q0"_a, "q1"_a, "k0"_a, "k1"_a, "pool"_a, "lambda_"_a.none(),
         "device"_a, "mamba"_a, nb::rv_policy::take_ownership)
      .def("rows", [](PySession& ps, const std::vector<int64_t>& positions, std::optional<std::vector<int64_t>> layers,
                      bool device) {
        auto out = std::make_unique<Rows>();
        ps.call([&](ds::Session& s) {
          need_result(s);
          const ds::ModelConfig& c = s.config();
          if (positions.empty()) throw ds::Error("rows: no positions given");
          const int64_t n = int64_t(s.ids().size());
          out->positions = ds::resolve_positions(positions, n);
          out->layers = layers ? *layers : c.map_layers();
          if (out->layers.empty()) throw ds::Error("rows: no layers given");
          for (int64_t l : out->layers) {
            check_layer(c, l, "rows");
            if (!c.has_maps(l)) throw ds::Error("rows: " + c.no_attention(l, "attention maps"));
          }
          out->heads = c.view_heads();
          out->n = n;
          out->differential = c.is_diff();
          for (int64_t l : out->layers) {
            out->lambdas.push_back(c.is_diff() ? float(s.effective_lambda(int(l))) : 0.f);
            for (int64_t h = 0; h < out->heads; ++h)
              out->head_lambdas.push_back(c.is_diff() ? float(s.head_lambda(int(l), int(h))) : 0.f);
          }
          const size_t per = size_t(out->heads) * out->positions.size() * size_t(n);
          const size_t all = per * out->layers.size();
          if (double(all) * (c.is_diff() ? 8.0 : 4.0) > 8e9)
            throw ds::Error("rows: " + std::to_string(out->positions.size()) + " rows of " + std::to_string(n) +
                            " keys in " + std::to_string(out->layers.size()) + " layers take more than 8 GB: ask fewer");
          if (device) {
            need_cuda(s, "rows");
            out->dev = ds::cuda_device_floats(all * (c.is_diff() ? 2 : 1), ps.device());
          } else {
            out->a1.resize(all);
            if (c.is_diff()) out->a2.resize(all);
          }
          for (size_t i = 0; i < out->layers.size(); ++i) {
            ds::MapRows r;
            if (device) {
              r.device_out1 = out->dev->data + i * per;
              r.device_out2 = c.is_diff() ? out->dev->data + all + i * per : nullptr;
            } else {
              r.out1 = out->a1.data() + i * per;
              r.out2 = c.is_diff() ? out->a2.data() + i * per : nullptr;
            }
            s.backend().map_rows(int(out->layers[i]), out->positions, r);
          }
          return 0;
        });
        return out.release();
      }, "positions"_a, "layers"_a.none(), "device"_a, nb::rv_policy::take_ownership)
      .def("mamba_row", [](PySession& ps, int layer, int channel, int64_t q) {
        std::vector<float> row = ps.call([&](ds::Session& s) {
          need_result(s);
          const int64_t n = int64_t(s.ids().size());
          if (q < 0) q += n;
          std::vector<float> r;
          s.backend().mamba_row(layer, channel, q, r);
          return r;
        });
        const size_t len = row.size();
        return owned(std::move(row), {len});
      }, "layer"_a, "channel"_a, "position"_a)
      .def("head_stats", [](PySession& ps, std::optional<std::vector<int64_t>> layers, std::optional<float> lambda) {
        // [layers][heads][11]: the HeadStats fields in declaration order, and the layers
        struct Out {
          std::vector<int64_t> layers;
          std::vector<float> v;
          int64_t heads = 0;
        };
        Out o = ps.call([&](ds::Session& s) {
          need_result(s);
          const ds::ModelConfig& c = s.config();
          Out r;
          r.layers = layers ? *layers : c.map_layers();
          r.heads = c.view_heads();
          for (int64_t l : r.layers) {
            check_layer(c, l, "stats");
            if (!c.has_maps(l)) throw ds::Error("stats: " + c.no_attention(l, "attention maps"));
          }
          if (lambda && !std::isfinite(*lambda)) throw ds::Error("stats: lambda must be a finite number");
          for (int64_t l : r.layers) {
            for (const ds::HeadStats& h : s.backend().head_stats(int(l), lambda))
              for (float x : {h.entropy1, h.entropy2, h.entropy_diff, h.first1, h.first2, h.first_diff, h.neg_mass,
                              h.diff_min, h.diff_max, h.max_logit1, h.max_logit2})
                r.v.push_back(x);
          }
          return r;
        });
        const size_t L = o.layers.size(), H = size_t(o.heads);
        return std::make_pair(o.layers, owned(std::move(o.v), {L, H, 11}));
      }, "layers"_a.none(), "lambda_"_a.none())
      .def("row_mass", [](PySession& ps, int layer, int64_t q, int64_t a0, int64_t a1) {
        std::vector<double> v = ps.call([&](ds::Session& s) {
          need_result(s);
          const ds::ModelConfig& c = s.config();
          check_layer(c, layer, "row_mass");
          if (!c.has_maps(layer)) throw ds::Error("row_mass: " + c.no_attention(layer, "attention maps"));
          const int64_t n = int64_t(s.ids().size());
          if (q < 0) q += n;
          ds::check_row_mass(q, n, a0, a1);
          std::vector<double> r;
          for (const ds::RowMass& m : s.backend().row_mass(layer, q, a0, a1))
            for (int k = 0; k < ds::MASS_NMAPS; ++k) {
              r.push_back(m.answer[k]);
              r.push_back(m.sink[k]);
              r.push_back(m.context[k]);
            }
          return r;
        });
        const size_t H = v.size() / (3 * ds::MASS_NMAPS);
        return owned(std::move(v), {H, size_t(ds::MASS_NMAPS), 3});
      }, "layer"_a, "position"_a, "a0"_a, "a1"_a)
      // profiler and readers
      .def("profile", [](PySession& ps) {
        ds::Profile p = ps.call([](ds::Session& s) { return s.backend().profile(); });
        nb::dict d;
        d["forward_ms"] = p.forward_ms;
        d["tokens"] = p.tokens;
        d["peak_tflops"] = p.peak_tflops;
        nb::list kernels;
        for (const ds::KernelTiming& k : p.kernels) {
          nb::dict e;
          e["name"] = k.name;
          e["count"] = k.count;
          e["total_ms"] = k.total_ms;
          e["min_ms"] = k.min_ms;
          e["max_ms"] = k.max_ms;
          kernels.append(e);
        }
        d["kernels"] = kernels;
        std::vector<int32_t> layer, head;
        std::vector<double> ms, flops;
        for (const ds::HeadTiming& h : p.heads) {
          layer.push_back(h.layer);
          head.push_back(h.head);
          ms.push_back(h.ms);
          flops.push_back(h.flops);
        }
        const size_t H = layer.size();
        d["head_layer"] = owned(std::move(layer), {H});
        d["head_head"] = owned(std::move(head), {H});
        d["head_ms"] = owned(std::move(ms), {H});
        d["head_flops"] = owned(std::move(flops), {H});
        nb::list lanes;  // a layer split's devices (split_backend.h): the Profiler's lanes
        for (const ds::DeviceLane& x : p.lanes) {
          nb::dict e;
          e["device"] = x.device;
          e["first_layer"] = x.first_layer;
          e["end_layer"] = x.end_layer;
          e["start_ms"] = x.start_ms;
          e["end_ms"] = x.end_ms;
          e["handoff_ms"] = x.handoff_ms;
          e["kernels_ms"] = x.kernels_ms;
          lanes.append(e);
        }
        d["lanes"] = lanes;
        return d;
      })
      .def("set_head_scale", [](PySession& ps, int layer, int head, std::optional<float> factor) {
        ps.call([&](ds::Session& s) { s.set_head_scale(layer, head, factor); return 0; });
      }, "layer"_a, "head"_a, "factor"_a.none())
      .def("head_scales", [](PySession& ps) {
        return ps.call([](ds::Session& s) {
          std::vector<std::tuple<int, int, float>> out;
          for (const ds::HeadScale& x : s.head_scales()) out.emplace_back(x.layer, x.head, x.factor);
          return out;
        });
      })
      .def("clear_head_scales", [](PySession& ps) { ps.call([](ds::Session& s) { s.clear_head_scales(); return 0; }); })
      .def("ablate", [](PySession& ps, int layer, int head, const std::string& mode) {
        ps.call([&](ds::Session& s) { s.ablate(layer, head, mode); return 0; });
      }, "layer"_a, "head"_a, "mode"_a)
      .def("set_head_lambda", [](PySession& ps, int layer, int head, std::optional<float> lambda) {
        ps.call([&](ds::Session& s) { s.set_head_lambda(layer, head, lambda); return 0; });
      }, "layer"_a, "head"_a, "lambda_"_a.none())
      .def("restore_head", [](PySession& ps, int layer, int head) {
        ps.call([&](ds::Session& s) {
          s.set_head_scale(layer, head, std::nullopt);
          s.set_head_mean(layer, head, false);
          if (s.config().is_diff()) s.set_head_mix(layer, head, false, std::nullopt);
          return 0;
        });
      }, "layer"_a, "head"_a)
      .def("knockout", [](PySession& ps, int layer0, int layer1, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
        ps.call([&](ds::Session& s) { s.add_knockout({layer0, layer1, q0, q1, k0, k1}); return 0; });
      }, "layer0"_a, "layer1"_a, "q0"_a, "q1"_a, "k0"_a, "k1"_a)
      .def("knockout_spec", [](PySession& ps, const std::string& spec) {
        ps.call([&](ds::Session& s) { s.add_knockout(ds::parse_knockout(spec, int(s.config().layers))); return 0; });
      }, "spec"_a)
      .def("interventions_json", [](PySession& ps) { return ps.call([](ds::Session& s) { return ds::interventions_json(s); }); })
      .def("clear_interventions", [](PySession& ps) { ps.call([](ds::Session& s) { s.clear_interventions(); return 0; }); })
      .def("importance_modes", [](PySession& ps) { return ps.call([](ds::Session& s) { return ds::importance_modes(s.config()); }); })
      .def("head_importance", [](PySession& ps, int32_t target, const std::vector<std::string>& modes) {
        ds::HeadImportance h = ps.call([&](ds::Session& s) {
          ds::HeadImportanceHooks hooks;
          hooks.cancel = &PySession::cancel;
          hooks.stop = &PySession::cancel;
          ds::HeadImportance r = ds::run_head_importance(s, {target, modes}, hooks);
          // The Ctrl-C that stopped it is taken here, inside call()'s scope (whose end hands an untaken one to
          // Python as a KeyboardInterrupt): the partial result comes back, with a warning, not an exception.
          if (r.end != ds::HeadImportance::End::Complete) InterruptScope::consume();
          return r;
        });
        const bool interrupted = h.end != ds::HeadImportance::End::Complete;
        nb::dict d;
        d["target"] = h.target;
        d["target_text"] = h.target_text;
        d["base_logp"] = h.base_logp;
        d["layers"] = h.layers;
        d["complete"] = !interrupted;
        d["heads"] = h.heads;
        d["done"] = h.done;
        d["total"] = h.total;
        nb::dict m;
        for (size_t i = 0; i < h.modes.size(); ++i) {
          std::vector<double> flat;
          for (const auto& row : h.delta[i]) flat.insert(flat.end(), row.begin(), row.end());
          m[h.modes[i].c_str()] = owned(std::move(flat), {h.layers.size(), size_t(h.heads)});
        }
        d["modes"] = m;
        return d;
      }, "target"_a, "modes"_a)
      .def("lens", [](PySession& ps, const std::vector<int64_t>& positions, const std::vector<int>& layers, int top_k,
                      int32_t target) {
        return ps.call([&](ds::Session& s) { return ds::lens_json(ds::logit_lens(s, {positions, layers, top_k, target})); });
      }, "positions"_a, "layers"_a, "top_k"_a, "target"_a)
      .def("set_logit_bits", [](PySession& ps, int bits) { ps.call([&](ds::Session& s) { s.set_logit_bits(bits); return 0; }); })
      .def_prop_ro("logit_bits", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.logit_bits(); }); })
      .def("quantize_report", [](PySession& ps, int bits) {
        return ps.call([&](ds::Session& s) { return ds::quantize_report_json(ds::quantize_report(s, bits)); });
      }, "bits"_a)
      .def("outliers", [](PySession& ps, bool logits) {
        ds::OutlierRequest q;  // Ctrl-C stops the logits' passes between layers: KeyboardInterrupt
        q.logits = logits;
        q.cancel = &PySession::cancel;
        return ps.call([&](ds::Session& s) { return ds::outliers_json(ds::outlier_stats(s, q)); });
      }, "logits"_a)
      .def("set_watch_max_abs_hidden", [](PySession& ps, bool on) {
        ps.call([&](ds::Session& s) { s.set_watch_max_abs_hidden(on); return 0; });
      })
      .def_prop_ro("watching_max_abs_hidden",
                   [](PySession& ps) { return ps.call([](ds::Session& s) { return s.watching_max_abs_hidden(); }); })
      .def("max_abs_hidden", [](PySession& ps) {
        std::vector<float> v = ps.call([](ds::Session& s) { return s.max_abs_hidden(); });
        const size_t L = v.size();
        return owned(std::move(v), {L});
      })
      // generation
      .def("begin_generation", [](PySession& ps, int max_new, double temperature, int top_k, double top_p,
                                  uint64_t seed, bool stop_at_eos) {
        ps.call([&](ds::Session& s) {
          ds::GenerateOptions g;
          g.max_new = max_new;
          g.sampling = {temperature, top_k, top_p, seed};
          g.stop_at_eos = stop_at_eos;
          if (max_new < 1) throw ds::Error("generate: max_new = " + std::to_string(max_new) + " must be at least 1");
          s.begin_generation(g);
          return 0;
        });
      }, "max_new"_a, "temperature"_a, "top_k"_a, "top_p"_a, "seed"_a, "stop_at_eos"_a)
      .def("generate_step", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.generate_step(); }); })
      .def("stop_generation", [](PySession& ps) { ps.call([](ds::Session& s) { s.stop_generation(); return 0; }); })
      .def("continue_generation", [](PySession& ps, int more) {
        return ps.call([&](ds::Session& s) { return s.continue_generation(more); });
      })
      .def("clear_generation", [](PySession& ps) { ps.call([](ds::Session& s) { s.clear_generation(); return 0; }); })
      .def_prop_ro("generating", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.generating(); }); })
      .def_prop_ro("stop_reason",
                   [](PySession& ps) { return ps.call([](ds::Session& s) { return std::string(ds::stop_reason_name(s.stop_reason())); }); })
      .def("generated", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.generated(); }); })
      .def("generated_text", [](PySession& ps) { return ps.call([](ds::Session& s) { return s.generated_text(); }); })
      .def("token_text", [](PySession& ps, int32_t id) {
        return ps.call([&](ds::Session& s) {
          if (id < 0 || id >= s.config().vocab)
            throw ds::Error("id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(s.config().vocab) + " tokens)");
          return s.tokenizer() ? s.tokenizer()->token_text(id) : std::to_string(id);
        });
      });

  nb::class_<PyScan>(m, "_Scan")
      .def(nb::init<PySession&, PySession*, const std::string&, double, std::optional<double>, const std::string&, int,
                    bool, int>(),
           "session"_a, "compare"_a.none(), "label"_a, "lambda_scale"_a, "compare_lambda_scale"_a.none(),
           "compare_label"_a, "max_answer_tokens"_a, "outliers"_a, "logit_bits"_a, nb::keep_alive<1, 2>(),
           nb::keep_alive<1, 3>())
      .def("add", &PyScan::add, "line"_a, "line_no"_a)
      .def("load", &PyScan::load, "path"_a)
      .def("run_loaded", &PyScan::run_loaded, "index"_a)
      .def("skip", &PyScan::skip, "line_no"_a, "why"_a)
      .def("report_json", &PyScan::report_json, "input"_a, "complete"_a)
      .def_prop_ro("scanned", &PyScan::scanned);
  m.def("_parse_size", &ds::parse_size, "text"_a, "name"_a);
  m.def("_replica_scan", &replica_scan, "model"_a, "compare"_a, "backend"_a, "threads"_a, "label"_a, "lambda_scale"_a,
        "compare_lambda_scale"_a.none(), "compare_label"_a, "max_answer_tokens"_a, "outliers"_a, "logit_bits"_a,
        "source"_a, "lines"_a, "max_prompts"_a.none(), "progress"_a.none());
}
