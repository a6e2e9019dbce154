// The engine thread. It owns the ds::Session; the UI never touches the session directly. The UI describes the
// state it wants in a Request (model to open, prompt, lambda controls, selected head, what to compute) and calls
// submit(); the worker brings the session to the latest request it has seen, so requests coalesce: while a run
// is in progress, any number of submits collapse into one follow-up run of the newest state. Results come back
// as immutable Snapshots (snapshot.h).
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/session/session.h"
#include "snapshot.h"

namespace ds::gui {

// A generation command. Commands are events: each bumps Request::gen_seq, and the worker carries out the newest
// one it has not seen (the controls that send them are disabled while the worker is busy, so none is lost).
enum class GenCommand {
  None,
  Start,  // begin_generation(gen) from the prompt, then stream steps until it stops
  Step,   // one token; begins a generation with `gen` when none is active
  Stop,   // stop between steps; what was generated stays
  Clear,  // back to the prompt alone
};

struct Request {
  uint64_t open_seq = 0;  // bump to open open_dir
  std::string open_dir;
  uint64_t prompt_seq = 0;  // bump to (re)run the prompt
  bool use_ids = false;
  std::string text;
  std::vector<int32_t> ids;
  LambdaControl lambda;  // override_ sized to the model's layers, or empty
  std::vector<HeadScale> head_scales;  // head interventions in force (Session::set_head_scale), in order
  std::vector<HeadMix> head_mixes;     // ... drop A1 / A2, a head's own lambda (Session::set_head_mix)
  std::vector<std::pair<int, int>> head_means;  // ... mean ablations (Session::set_head_mean)
  std::vector<Knockout> knockouts;     // ... key knockouts (Session::add_knockout)
  bool lens = false;                   // the logit lens at the row view's position (session_lens.h)
  bool outliers = false;               // the activation outliers of each result (session_outliers.h)
  int logit_bits = 0;                  // the quantisation what-if (Session::set_logit_bits; 0: full precision)
  int layer = 0, head = 0;
  // The head view's rectangle and grid (Backend::map_view; -1 = up to n), from the panel's zoom, pan and size.
  ViewRequest view;
  int64_t row = -1;  // the row view's query position (negative counts from the end: -1 = the last token)
  bool overview = true;  // per-layer statistics and thumbnails for every layer
  bool sweep = true;     // lambda sweep of the selected layer
  bool max_abs_hidden = false;  // the Table 5 reader: every layer's largest |hidden state| (RunResult::max_abs_hidden)
  int sweep_points = 17;
  uint64_t importance_seq = 0;  // bump to measure every head's importance (the Overview's importance mode)
  std::string importance_mode = "head";  // ... ablating each head in this mode (head, a2, a1, mean)
  uint64_t quant_report_seq = 0;  // bump to measure the quantised logits against full precision (the lambda panel)
  // Generation: the newest command (see GenCommand) and the options a Start or a first Step uses.
  uint64_t gen_seq = 0;
  GenCommand gen_cmd = GenCommand::None;
  int gen_steps = 1;  // Step: how many Step commands in a row ended the sequence (all of them are carried out)
  GenerateOptions gen;
  // Corpus scan (worker_scan.cpp): bump scan_seq to scan scan.path; bump scan_stop_seq to stop the scan between
  // prompts (what was done stays). While a scan runs the worker serves nothing else; afterwards it brings the
  // session back to this request (the prompt runs again).
  uint64_t scan_seq = 0, scan_stop_seq = 0;
  uint64_t scan_stop_base = 0;  // scan_stop_seq when this scan was asked for (a Stop sent before it began counts)
  ScanOptions scan;
};

class Worker {
 public:
  // wake() is called (from the worker thread) whenever a new snapshot is published.
  // scan_backends: the Corpus panel's replicas (--backend cuda:all, cuda:0,1, cpu,cpu); the first is `backend`, the
  // worker's own session, the others open the model for a scan. Empty: the worker's session alone.
  // backends: the devices (--backend cuda:0,1 / cuda:all): the model on as few of them as hold it (a layer split when
  // one is too small, or with gpu_mem_limit); the Corpus panel's scans run a replica on each device (group) left.
  Worker(std::function<void()> wake, std::vector<BackendChoice> backends, int cpu_threads, int64_t gpu_mem_limit = 0);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void submit(const Request& r);
  std::shared_ptr<const Snapshot> snapshot() const;
  // True when the latest request has been fully served (runs, maps, overview and sweep) and no generation streams.
  bool idle() const;

 private:
  void loop();
  void step(const Request& r);
  void open(const std::string& dir, int64_t plan_tokens);  // plan_tokens: Session::open's (0: 4096)
  bool apply_lambda(const LambdaControl& want);
  // false: stopped because the user moved lambda on (r given: its run may be cancelled; see lambda_superseded)
  bool run_and_publish(bool ids_changed = false, const Request* r = nullptr);
  void publish_result(int first_layer, double run_ms, bool ids_changed, int64_t decoded = 0);
  bool generation_command(const Request& r, uint64_t applied_before);
  bool generation_step();
  void archive_continuation();
  void reset_generation();
  std::shared_ptr<Generation> generation_state() const;
  void set_streaming(bool on);
  void summarize(const Request& r);
  void refresh_head(const Request& r);
  void preview_head(const Request& r);
  void publish_head(const Request& r, std::optional<float> lambda);
  void refresh_row(const Request& r);
  void run_sweep(const Request& r);
  void run_importance(const Request& r);
  void run_quant_report(const Request& r);
  uint64_t applied_importance_ = 0, applied_quant_report_ = 0;
  void refresh_lens(const Request& r);
  void refresh_outliers(const Request& r);
  uint64_t outliers_seq_ = 0;  // the result whose outliers were published
  std::shared_ptr<const Snapshot::LensView> lens_;
  void run_scan(const Request& r);  // worker_scan.cpp
  void publish_scan(std::shared_ptr<const ScanState> scan);
  bool scan_stop_requested(uint64_t stop_seq_at_start) const;
  bool superseded() const;
  bool lambda_superseded(const Request& r) const;
  template <class F>
  void traced(const char* stage, F&& f);
  void report_error(const std::string& what);
  template <class F>
  void publish(F&& edit);

  std::function<void()> wake_;
  std::vector<BackendChoice> backends_;
  int cpu_threads_;
  int64_t gpu_mem_limit_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Request want_;
  uint64_t version_ = 0, serving_ = 0, served_ = 0;
  uint64_t serving_scan_ = 0;  // the scan_seq being scanned (a newer one stops it)
  bool working_ = false, stop_ = false;
  bool streaming_ = false;  // a generation streams: the loop keeps stepping without a new request
  std::shared_ptr<const Snapshot> snap_;

  // Worker-thread only.
  std::unique_ptr<Session> session_;
  uint64_t model_seq_ = 0, result_seq_ = 0;
  uint64_t applied_open_ = 0, applied_prompt_ = 0, applied_scan_ = 0;
  // Per kind of intervention: the request's list the session last refused an entry of (reported once, its valid
  // entries in force; the same list is not tried again at every step) and each refused entry with why. A knockout's
  // refusal holds for the sequence length it was checked against (knockouts_n_).
  template <class T>
  struct EditList {
    std::optional<std::vector<T>> refused_want;
    std::vector<T> applied;  // its entries the session took
    std::vector<std::pair<T, std::string>> why;
  };
  EditList<HeadScale> scales_;
  EditList<HeadMix> mixes_;
  EditList<std::pair<int, int>> means_;
  EditList<Knockout> knockouts_;
  int64_t knockouts_n_ = -1;
  void forget_refused() { scales_ = {}, mixes_ = {}, means_ = {}, knockouts_ = {}, knockouts_n_ = -1; }
  int head_layer_ = -1, head_head_ = -1;
  uint64_t head_result_ = 0;
  ViewRequest head_view_;
  std::shared_ptr<Overview> ov_;  // the overview being filled (published as copies)
  uint64_t applied_gen_ = 0;
  Continuation cur_;                            // the continuation being generated or last generated
  std::shared_ptr<const Continuation> before_;  // the one it replaced
  double step_ms_ = 0;
  std::chrono::steady_clock::time_point views_at_{};  // while streaming: when the head and row were last refreshed
  std::thread thread_;
};

}  // namespace ds::gui
