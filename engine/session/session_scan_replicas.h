// A corpus scan on several replicas of the model (diffscope-scan --backend cuda:all, cuda:0,1, ...; one replica is
// the plain scan): one Session per backend (and one more per backend for a compare model), the prompts handed out
// one at a time to whichever replica is free, so long and short prompts mix without one GPU waiting on another (in
// input order, but for passing over a length bucket another replica is starting: session_scan_queue.h). Each
// replica computes a prompt exactly as a one-GPU scan would (the same kernels on the same kind of device); the
// results are kept per prompt and the report is made from all of them in input order, with exactly rounded sums
// (session_scan.h ExactSum): the same report, whatever the order in which prompts finish.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/session/backends.h"
#include "engine/session/session_scan.h"

namespace ds::scan {

struct ReplicaScanOptions {
  std::string model, compare_model;     // compare_model empty: a second run (if any) is of `model`
  // The devices (parse_backend_list): one replica each when the model fits one device, else one replica per group of
  // as many consecutive devices as a layer split of it needs (split_backend.h), the rest left idle.
  std::vector<BackendChoice> backends;
  int64_t mem_limit = 0;                // --gpu-mem-limit: bytes each device may hold (0: its free memory)
  int64_t plan_tokens = 0;              // the longest prompt a layer split plans for (corpus_plan_tokens; 0: 4096)
  int threads = 0;                      // CPU backends: threads each (0: the cores shared out among the CPU replicas)
  RunOptions first;
  std::optional<RunOptions> second;     // a comparison: every prompt through both runs, or through neither
  ProgressFn load_progress;             // the models' loading, replica by replica
  // Replica 0's session for `model` (not owned; the GUI's own, on backends[0]): the other replicas open the model
  // on backends[1..]. Null: every replica opens its own.
  Session* first_session = nullptr;
};

class ReplicaScan {
 public:
  // Opens every replica's sessions; throws ds::Error (naming the backend) when one cannot be had.
  explicit ReplicaScan(const ReplicaScanOptions& opt);
  ~ReplicaScan();
  size_t replicas() const { return reps_.size(); }
  std::string backend_name() const;  // the first replica's, and how many there are

  // Scans `prompts` over the replicas. After each prompt, done(prompt, error) runs on the scanning thread with the
  // scan's lock held (error: null when it was scanned, else why it was skipped, one line); report() may be called
  // there. cancelled() is polled by every replica between steps; once true no new prompt starts, the ones in flight
  // stop (and count for nothing), and run returns false. An error that is not the prompt's (a device fault) stops
  // every replica and is thrown from here after they have stopped.
  // result: the first run's result for the prompt (null when skipped).
  bool run(const std::vector<Prompt>& prompts, const std::function<bool()>& cancelled,
           const std::function<void(const Prompt&, const PromptResult* result, const std::string* error)>& done);

  // The report of the prompts scanned so far (from done(), or after run).
  Report report(const std::string& input, const std::vector<LineError>& skipped, bool complete, double elapsed_s) const;
  size_t scanned() const { return results_.empty() ? 0 : results_[0].size(); }

 private:
  struct Replica;
  size_t group_ = 1;  // devices per replica
  std::vector<std::unique_ptr<Replica>> reps_;
  std::vector<std::vector<PromptResult>> results_;  // [run][prompt], in the order they finished
};

}  // namespace ds::scan
