// A corpus scan on several replicas (session_scan_replicas.h).
#include "engine/session/session_scan_replicas.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "engine/core/env.h"
#include "engine/core/error.h"
#include "engine/core/length_bucket.h"
#include "engine/core/model.h"
#include "engine/session/session_scan_queue.h"
#include "engine/session/split_backend.h"

namespace ds::scan {

struct ReplicaScan::Replica {
  std::vector<BackendChoice> backends;  // one device, or a layer split's group
  std::unique_ptr<Session> own1, s2;
  Session* s1 = nullptr;
  std::vector<std::unique_ptr<Run>> runs;
};

ReplicaScan::ReplicaScan(const ReplicaScanOptions& opt) {
  if (opt.backends.empty()) throw Error("a scan needs at least one backend");
  // Devices one replica needs: the placement of a layer split over the list from its first device (one when the model
  // fits one device; the given first session's own split otherwise).
  {
    SplitOptions so;
    so.backends = opt.backends;
    so.mem_limit = opt.mem_limit;
    so.cpu_threads = opt.threads;
    if (opt.plan_tokens > 0) so.plan_tokens = opt.plan_tokens;
    if (opt.first_session && opt.first_session->backend().devices_used() > 1)
      group_ = size_t(opt.first_session->backend().devices_used());
    else if (opt.backends.size() > 1 || opt.mem_limit > 0)  // the devices up to the last one the placement uses
      group_ = size_t(place_layers(opt.first_session ? opt.first_session->config() : load_model(opt.model)->cfg, so).dev.back()) + 1;
  }
  const size_t nrep = std::max<size_t>(1, opt.backends.size() / group_);
  int cpu_reps = 0;
  for (const BackendChoice& b : opt.backends) cpu_reps += b.kind == BackendChoice::Kind::Cpu;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // CPU replicas share the cores unless told otherwise: two of them on a 2-core machine run one thread each.
  const int cpu_threads = opt.threads > 0 ? opt.threads : cpu_reps > 1 ? std::max(1, int(cores) / cpu_reps) : 0;
  // The replicas open at once, a thread each (each loads its own copy of the weights onto its devices), and each
  // runs a short warm-up forward there (module loading, cuBLAS), so that a scan's first prompts on every device are
  // not its start-up. An error of any replica is thrown after all have finished.
  reps_.resize(nrep);
  std::vector<std::exception_ptr> faults(nrep);
  std::mutex progress_mu;
  const auto open_one = [&](size_t i) {
    try {
      auto r = std::make_unique<Replica>();
      r->backends.assign(opt.backends.begin() + ptrdiff_t(i * group_),
                         opt.backends.begin() + ptrdiff_t(std::min(opt.backends.size(), (i + 1) * group_)));
      const std::string tag = nrep > 1 ? "replica " + std::to_string(i + 1) + "/" + std::to_string(nrep) + ": " : "";
      auto progress = [&](double f, const std::string& what) {
        std::lock_guard lk(progress_mu);
        if (opt.load_progress) opt.load_progress(f, tag + what);
      };
      if (i == 0 && opt.first_session) {
        r->s1 = opt.first_session;
      } else {
        r->own1 = Session::open(opt.first_session ? opt.first_session->model_dir() : opt.model, r->backends, progress,
                                cpu_threads, opt.mem_limit, opt.plan_tokens);
        r->s1 = r->own1.get();
        if (nrep > 1) {  // the warm-up (a scan's prompts replace its ids and result)
          r->s1->set_ids(std::vector<int32_t>(16, 0));
          r->s1->run();
        }
        if (opt.first_session) {  // the GUI's session: its lambda overrides and interventions on every replica
          const Session& f = *opt.first_session;
          for (int l = 0; l < f.config().layers; ++l)
            if (f.lambda_control().override_.size() > size_t(l) && f.lambda_control().override_[size_t(l)])
              r->s1->set_lambda_override(l, f.lambda_control().override_[size_t(l)]);
          r->s1->set_head_scales(f.head_scales());
          r->s1->set_head_mixes(f.head_mixes());
          r->s1->set_head_means(f.head_means());
          r->s1->set_knockouts(f.knockouts());
        }
      }
      if (!opt.compare_model.empty())
        r->s2 = Session::open(opt.compare_model, r->backends, progress, cpu_threads, opt.mem_limit, opt.plan_tokens);
      r->runs.push_back(std::make_unique<Run>(*r->s1, opt.first));
      if (opt.second) r->runs.push_back(std::make_unique<Run>(r->s2 ? *r->s2 : *r->s1, *opt.second));
      reps_[i] = std::move(r);
    } catch (...) {
      faults[i] = std::current_exception();
    }
  };
  if (nrep == 1) {
    open_one(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nrep; ++i) threads.emplace_back(open_one, i);
    for (std::thread& t : threads) t.join();
  }
  for (const std::exception_ptr& f : faults)
    if (f) std::rethrow_exception(f);
  results_.resize(reps_[0]->runs.size());
}

ReplicaScan::~ReplicaScan() = default;

std::string ReplicaScan::backend_name() const {
  const std::string one = reps_[0]->s1->backend().name();
  if (reps_.size() == 1) return one;
  std::string list;
  for (const auto& r : reps_) list += (list.empty() ? "" : " | ") + backend_list_text(r->backends);
  return one + " (" + std::to_string(reps_.size()) + " replicas: " + list + ")";
}

bool ReplicaScan::run(const std::vector<Prompt>& prompts, const std::function<bool()>& cancelled,
                      const std::function<void(const Prompt&, const PromptResult*, const std::string*)>& done) {
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::exception_ptr fault;
  size_t finished = 0;  // prompts scanned or skipped
  // A prompt's length bucket: its ids', or for a text its bytes times the tokens per byte of the texts scanned so far
  // (an estimate: it only orders the prompts).
  double text_tokens = 0, text_bytes = 0;
  PromptQueue queue(prompts.size(), [&](size_t i) {
    const Prompt& p = prompts[i];
    if (!p.is_text) return gemm_length_bucket(int64_t(p.ids.size()));
    const double per_byte = text_bytes > 0 ? text_tokens / text_bytes : 0.25;
    return gemm_length_bucket(int64_t(double(p.text.size()) * per_byte) + 1);
  }, env_switch("DS_SCAN_IN_ORDER", false) ? 1 : 64);  // (a look-ahead of one prompt: input order, for A/B runs)
  const auto stopped = [&] { return stop.load() || (cancelled && cancelled()); };
  const auto work = [&](Replica& rep) {
    for (;;) {
      if (stopped()) return;
      std::optional<size_t> next;
      {
        std::lock_guard lk(mu);
        next = queue.take();
      }
      if (!next) return;
      const Prompt& p = prompts[*next];
      std::string why;
      bool ok = false;
      try {
        scan_all(rep.runs, p, stopped);  // every run or none
        ok = true;
      } catch (const Cancelled&) {
        return;  // nothing of this prompt counts
      } catch (const Error& e) {
        why = e.what();  // the prompt's: skipped
      } catch (...) {
        std::lock_guard lk(mu);
        if (!fault) fault = std::current_exception();
        stop = true;
        return;
      }
      std::lock_guard lk(mu);
      queue.done(*next);
      if (ok) {
        if (p.is_text) text_tokens += double(rep.runs[0]->results().back().tokens), text_bytes += double(p.text.size());
        for (size_t k = 0; k < rep.runs.size(); ++k) {
          results_[k].push_back(rep.runs[k]->results().back());
          rep.runs[k]->drop_last();  // kept here only: the replica's runs compute, the scan keeps
        }
      }
      ++finished;
      if (done) done(p, ok ? &results_[0].back() : nullptr, ok ? nullptr : &why);
    }
  };
  if (reps_.size() == 1) {
    work(*reps_[0]);
  } else {
    std::vector<std::thread> threads;
    for (auto& r : reps_) threads.emplace_back([&, rp = r.get()] { work(*rp); });
    for (std::thread& t : threads) t.join();
  }
  if (fault) std::rethrow_exception(fault);
  return finished == prompts.size();
}

Report ReplicaScan::report(const std::string& input, const std::vector<LineError>& skipped, bool complete,
                           double elapsed_s) const {
  std::vector<const Run*> runs;
  for (const auto& r : reps_[0]->runs) runs.push_back(r.get());
  return make_report(runs, results_, input, skipped, complete, elapsed_s);
}

}  // namespace ds::scan
