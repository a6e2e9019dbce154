// The engine thread: opens models, runs prompts, recomputes after lambda changes from the first changed layer,
// extracts the selected head, summarises every layer for the overview and sweeps lambda. See worker.h.
#include "worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <tuple>

#include "engine/core/env.h"
#include "engine/core/error.h"
#include "engine/session/session_importance.h"
#include "engine/session/session_lens.h"
#include "engine/session/session_outliers.h"
#include "engine/session/session_sweep.h"

namespace ds::gui {

namespace {
using Clock = std::chrono::steady_clock;

// Thumbnails (a mean-pooled 32 x 32 view of every head) only up to this many tokens: each costs a pass over the
// head's map in the engine, like its statistics, and at longer prompts the grid of statistics is what stays fast.
constexpr int64_t k_thumb_max_tokens = 4096;
constexpr int k_thumb_size = 32;
}  // namespace

Worker::Worker(std::function<void()> wake, std::vector<BackendChoice> backends, int cpu_threads, int64_t gpu_mem_limit)
    : wake_(std::move(wake)), backends_(std::move(backends)), cpu_threads_(cpu_threads), gpu_mem_limit_(gpu_mem_limit),
      snap_(std::make_shared<Snapshot>()) {
  thread_ = std::thread([this] { loop(); });
}

Worker::~Worker() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Worker::submit(const Request& r) {
  {
    std::lock_guard lk(mu_);
    want_ = r;
    ++version_;
  }
  cv_.notify_all();
}

std::shared_ptr<const Snapshot> Worker::snapshot() const {
  std::lock_guard lk(mu_);
  return snap_;
}

bool Worker::idle() const {
  std::lock_guard lk(mu_);
  return !working_ && served_ == version_ && !streaming_;
}

void Worker::set_streaming(bool on) {
  std::lock_guard lk(mu_);
  streaming_ = on;
}

// DS_GUI_TRACE=1: each stage of the worker's step on stderr with its wall time (how the first screen and a lambda
// change spend their time; the replay logs of the README were read with it).
template <class F>
void Worker::traced(const char* stage, F&& f) {
  static const bool on = [] {
    try {
      return env_switch("DS_GUI_TRACE", false);
    } catch (const Error& e) {  // the GUI goes on without the trace, saying why
      std::fprintf(stderr, "diffscope: %s; the stage trace stays off\n", e.what());
      return false;
    }
  }();
  if (!on) {
    f();
    return;
  }
  const auto t0 = Clock::now();
  f();
  std::fprintf(stderr, "diffscope: worker %-12s %8.1f ms\n", stage,
               std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

// A newer request moves lambda, the prompt, the model or a generation: the run serving r is worth stopping (a view
// or selection change is not: the run's result is still what the user will see).
bool Worker::lambda_superseded(const Request& r) const {
  std::lock_guard lk(mu_);
  if (stop_)
    return true;
  if (version_ == serving_)
    return false;
  return want_.open_seq != r.open_seq || want_.prompt_seq != r.prompt_seq || want_.gen_seq != r.gen_seq ||
         want_.scan_seq != r.scan_seq || want_.lambda.scale != r.lambda.scale ||
         want_.lambda.override_ != r.lambda.override_ || want_.head_scales != r.head_scales ||
         want_.head_mixes != r.head_mixes || want_.knockouts != r.knockouts || want_.head_means != r.head_means ||
         want_.logit_bits != r.logit_bits;
}

bool Worker::superseded() const {
  std::lock_guard lk(mu_);
  return stop_ || version_ != serving_;
}

template <class F>
void Worker::publish(F&& edit) {
  {
    std::lock_guard lk(mu_);
    auto next = std::make_shared<Snapshot>(*snap_);
    edit(*next);
    ++next->seq;
    snap_ = std::move(next);
  }
  if (wake_)
    wake_();
}

void Worker::publish_scan(std::shared_ptr<const ScanState> scan) {
  publish([&](Snapshot& s) { s.scan = std::move(scan); });
}

void Worker::report_error(const std::string& what) {
  publish([&](Snapshot& s) {
    s.error = what;
    s.error_opening = false;
    s.error_refusal = false;
    ++s.error_seq;
  });
}

void Worker::loop() {
  for (;;) {
    Request r;
    {
      std::unique_lock lk(mu_);
      // A streaming generation keeps the loop going: each pass takes the newest request (Stop, lambda, selection)
      // and then generates one more token.
      cv_.wait(lk, [&] { return stop_ || version_ != served_ || streaming_; });
      if (stop_)
        return;
      r = want_;
      serving_ = version_;
      working_ = true;
    }
    try {
      step(r);
    } catch (const std::exception& e) {
      report_error(e.what());
      if (streaming_) {  // never spin on a failing step
        set_streaming(false);
        if (session_)
          session_->stop_generation();
        auto g = session_ ? generation_state() : nullptr;
        publish([&](Snapshot& s) { s.gen = g; });
      }
    }
    if (snapshot()->running)
      publish([](Snapshot& s) { s.running = false; });
    {
      std::lock_guard lk(mu_);
      served_ = serving_;
      working_ = false;
    }
    if (wake_)
      wake_();
  }
}

// [SECTION] the step: bring the session to the request
void Worker::step(const Request& r) {
  if (r.open_seq != applied_open_) {
    applied_open_ = r.open_seq;
    applied_gen_ = r.gen_seq;  // a generation command never carries over to another model
    // Several devices or a memory limit: the layers are placed for 4K tokens, or for the prompt in the box and a
    // generation of it when that is longer (the tokenizer alone counts its tokens; a later prompt longer than the
    // plan may not fit, and is refused with the numbers).
    int64_t plan = 0;
    if (backends_.size() > 1 || gpu_mem_limit_ > 0) {
      const int64_t n = r.use_ids ? int64_t(r.ids.size()) : count_tokens_before_load(r.open_dir, r.text);
      plan = std::max<int64_t>(4096, n + r.gen.max_new);
    }
    open(r.open_dir, plan);
    if (r.scan_seq != applied_scan_) {
      // A scan asked for while another model was being opened: not run on a model the user has not seen yet.
      applied_scan_ = r.scan_seq;
      auto refused = std::make_shared<ScanState>();
      refused->seq = r.scan_seq;
      refused->options = r.scan;
      refused->error = "the scan did not start: a model was being opened. Start it again";
      publish_scan(std::move(refused));
    }
    return;  // the UI answers a new model with a fresh request (prompt mode, lambda controls sized to L)
  }
  // A corpus scan takes the session over (worker_scan.cpp); afterwards the request's prompt runs again, so that the
  // views show the prompt of the Prompt panel and not the scan's last one.
  bool restore = false;
  if (r.scan_seq != applied_scan_) {
    applied_scan_ = r.scan_seq;
    run_scan(r);
    restore = session_ && r.prompt_seq != 0;
    std::lock_guard lk(mu_);
    if (stop_)
      return;  // the program is closing: no prompt to bring back
  }
  if (!session_)
    return;

  bool prompt_ok = false;
  if (r.prompt_seq != applied_prompt_ || restore) {
    applied_prompt_ = r.prompt_seq;
    try {
      // The knockouts are checked against the new prompt below (a span it does not hold refused once, the prompt
      // run without it), not by set_ids (which refuses a prompt that a knockout in force does not fit)
      session_->set_knockouts({});
      if (r.use_ids)
        session_->set_ids(r.ids);
      else
        session_->set_prompt(r.text);
      prompt_ok = true;
    } catch (const std::exception& e) {
      report_error(e.what());
    }
    if (prompt_ok)
      reset_generation();  // the session dropped its continuation with the old prompt
  }
  bool lambda_changed = false;
  try {
    lambda_changed = apply_lambda(r.lambda);
  } catch (const std::exception& e) {
    report_error(e.what());
  }
  // Head interventions re-run from their first changed layer, as a lambda does. A list the session refuses an entry
  // of (a head or layer out of range from the command line, a span outside the prompt) has its valid entries put in
  // force, and the refused ones are reported once, in one line, and published (the Lambda panel marks them).
  std::vector<std::string> refusals;  // new this step
  bool refused_changed = false;
  auto apply = [&](const auto& want, auto& el, auto&& set) {
    using List = std::decay_t<decltype(want)>;
    if (el.refused_want && *el.refused_want == want) {  // refused before: its valid entries (again, after a prompt)
      try {
        lambda_changed = set(el.applied) || lambda_changed;
      } catch (const std::exception&) {
      }
      return;
    }
    try {
      lambda_changed = set(want) || lambda_changed;
      refused_changed |= !el.why.empty();
      el.refused_want.reset();
      el.why.clear();
    } catch (const std::exception&) {
      el.refused_want = want;
      const auto before = std::move(el.why);
      el.why.clear();
      refused_changed = true;
      List ok;
      for (const auto& x : want) {
        List t = ok;
        t.push_back(x);
        try {
          set(t);
          ok = std::move(t);
        } catch (const std::exception& e) {
          el.why.push_back({x, e.what()});
        }
      }
      // said when the entries refused are others than before (a generation's growing length re-checks knockouts
      // at every token: the same refusal is not said again)
      bool same = before.size() == el.why.size();
      for (size_t i = 0; same && i < before.size(); ++i) same = before[i].first == el.why[i].first;
      if (!same)
        for (const auto& w : el.why) refusals.push_back(w.second);
      try {
        set(ok);
      } catch (const std::exception&) {
      }
      el.applied = std::move(ok);
      lambda_changed = true;
    }
  };
  apply(r.head_scales, scales_, [&](const auto& v) { return session_->set_head_scales(v); });
  apply(r.head_mixes, mixes_, [&](const auto& v) { return session_->set_head_mixes(v); });
  if (r.logit_bits != session_->logit_bits()) {  // the quantisation what-if: every layer from the first again
    try {
      session_->set_logit_bits(r.logit_bits);
      lambda_changed = true;
    } catch (const std::exception& e) {
      report_error(e.what());
    }
  }
  apply(r.head_means, means_, [&](const auto& v) { return session_->set_head_means(v); });
  // (each against the sequence the next run resolves it for: a span the sequence does not hold is refused here,
  // once for that length, not at every run)
  const int64_t n_now = int64_t(session_->ids().size());
  if (n_now != knockouts_n_) knockouts_.refused_want.reset(), knockouts_n_ = n_now;
  apply(r.knockouts, knockouts_, [&](const auto& v) {
    if (n_now > 0)
      for (const Knockout& k : v) session_->resolve_knockout(k, n_now);
    return session_->set_knockouts(v);
  });
  if (refused_changed) {
    auto rf = std::make_shared<Snapshot::Refused>();
    rf->scales = scales_.why, rf->mixes = mixes_.why, rf->means = means_.why, rf->knockouts = knockouts_.why;
    publish([&](Snapshot& s) { s.refused = rf->empty() ? nullptr : rf; });
  }
  if (!refusals.empty()) {
    std::string line = refusals.size() == 1 ? refusals[0]
                                            : std::to_string(refusals.size()) + " interventions not applied: " + refusals[0];
    for (size_t i = 1; i < refusals.size(); ++i) line += "; " + refusals[i];
    publish([&](Snapshot& s) {
      s.error = line;
      s.error_opening = false;
      s.error_refusal = true;
      ++s.error_seq;
    });
  }
  bool reader_on = false;  // the Table 5 reader turned on: the next run covers every layer
  if (r.max_abs_hidden != session_->watching_max_abs_hidden()) {
    session_->set_watch_max_abs_hidden(r.max_abs_hidden);
    reader_on = r.max_abs_hidden;
  }
  if (lambda_changed && session_->generating())
    cur_.lambda_moved = true;  // the next steps run under the new lambda (generate_step re-runs from that layer)
  if (session_->ids().empty())
    return;
  bool ids_changed = false, gen_changed = false;
  if (r.gen_seq != applied_gen_) {
    const uint64_t applied_before = applied_gen_;
    applied_gen_ = r.gen_seq;
    gen_changed = true;
    try {
      ids_changed = generation_command(r, applied_before);
    } catch (const std::exception& e) {
      report_error(e.what());
      set_streaming(false);
      ids_changed = true;  // a failed step leaves the session to run again
    }
  }
  if (lambda_changed && !prompt_ok && !ids_changed && !streaming_)
    traced("preview_head", [&] { preview_head(r); });
  if (prompt_ok || lambda_changed || ids_changed || reader_on || !session_->has_result()) {
    bool done = true;
    traced("run", [&] { done = run_and_publish(prompt_ok || ids_changed, &r); });
    if (!done)
      return;  // the user has moved lambda on: the newer request runs next, from the layer this run stopped in
  }
  else if (gen_changed) {
    auto g = generation_state();
    publish([&](Snapshot& s) { s.gen = g; });
  }
  // A streaming generation: one token per pass of the loop, published as it comes. The head and row views follow
  // a few times a second; the overview and the sweep wait until the generation stops.
  if (streaming_) {
    const auto t0 = Clock::now();
    bool ok = true;
    try {
      generation_step();
    } catch (const std::exception& e) {
      report_error(e.what());
      ok = false;
    }
    if (ok && session_->has_result())
      publish_result(0, std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), true, 1);
    else
      run_and_publish(true);  // the backend may hold part of the failed step: run the sequence again
    if (streaming_) {
      if (Clock::now() - views_at_ >= std::chrono::milliseconds(250) && !superseded()) {
        refresh_head(r);
        refresh_row(r);
        views_at_ = Clock::now();
      }
      return;
    }
  }
  // What is on screen first (the selected head), then the overview, then the sweep; each stage returns early when
  // a newer request is waiting and picks up where it was on the next step.
  if (superseded())
    return;
  traced("head", [&] { refresh_head(r); });
  if (!superseded())
    traced("row", [&] { refresh_row(r); });
  if (r.overview && !superseded())
    traced("overview", [&] { summarize(r); });
  if (r.sweep && session_->config().is_diff() && !superseded())
    traced("sweep", [&] { run_sweep(r); });
  if (r.lens && !superseded())
    traced("lens", [&] { refresh_lens(r); });
  if (r.outliers && !superseded())
    traced("outliers", [&] { refresh_outliers(r); });
  if (r.importance_seq != applied_importance_ && !superseded())
    traced("importance", [&] { run_importance(r); });
  if (r.quant_report_seq != applied_quant_report_ && !superseded())
    traced("quantize", [&] { run_quant_report(r); });
}

// The quantised logits against full precision (session_quantize.h): a full-precision forward and the quantised one
// again, asked for by the lambda panel's button (three forwards: not at every change of the bits).
void Worker::run_quant_report(const Request& r) {
  applied_quant_report_ = r.quant_report_seq;
  if (session_->logit_bits() == 0) return;
  auto v = std::make_shared<Snapshot::QuantView>();
  v->result_seq = result_seq_;
  try {
    publish([](Snapshot& s) { s.running = true; });
    v->q = quantize_report(*session_, session_->logit_bits());
  } catch (const std::exception& e) {
    publish([](Snapshot& s) { s.running = false; });
    report_error(e.what());
    return;
  }
  publish([&](Snapshot& s) {
    s.quant = v;
    s.running = false;
  });
}

// The activation outliers of the result, once per result (session_outliers.h; the logits are recomputed twice,
// layer by layer: seconds at long prompts). A request for another result (a new prompt, lambda, intervention) stops
// them between layers, and that result computes them again; the Profiler shows the fraction done.
void Worker::refresh_outliers(const Request& r) {
  if (outliers_seq_ == result_seq_) return;
  auto v = std::make_shared<Snapshot::OutlierView>();
  v->result_seq = result_seq_;
  OutlierRequest q;
  q.cancel = [this, &r] { return lambda_superseded(r); };
  q.progress = [this](double f) { publish([f](Snapshot& s) { s.outliers_fraction = f; }); };
  try {
    v->o = outlier_stats(*session_, q);
  } catch (const Cancelled&) {
    publish([](Snapshot& s) { s.outliers_fraction = -1; });
    return;
  } catch (const std::exception& e) {
    publish([](Snapshot& s) { s.outliers_fraction = -1; });
    report_error(e.what());
    return;
  }
  outliers_seq_ = result_seq_;
  publish([&](Snapshot& s) {
    s.outliers = v;
    s.outliers_fraction = -1;
  });
}

// The logit lens at the row view's position, once per result and position (session_lens.h).
void Worker::refresh_lens(const Request& r) {
  if (lens_ && lens_->result_seq == result_seq_ && lens_->asked_row == r.row) return;
  auto v = std::make_shared<Snapshot::LensView>();
  v->result_seq = result_seq_;
  v->asked_row = r.row;
  try {
    v->lens = logit_lens(*session_, LensRequest{{r.row}, {}, 5, -1});
  } catch (const std::exception& e) {
    report_error(e.what());
    return;
  }
  lens_ = v;
  publish([&](Snapshot& s) { s.lens = v; });
}

// The engine's head importance (engine/session/session_importance.h): one ablation per head, each a re-run from its
// layer; the map so far is published after each layer. A newer request stops it between ablations (what was measured
// stays on screen, marked incomplete); a lambda the user has moved on from cancels the run inside an ablation.
void Worker::run_importance(const Request& r) {
  applied_importance_ = r.importance_seq;
  const uint64_t seq = result_seq_;
  auto to_gui = [&](const HeadImportance& h) {
    auto imp = std::make_shared<Snapshot::Importance>();
    imp->result_seq = seq;
    imp->h = h;
    return imp;
  };
  HeadImportanceHooks hooks;
  hooks.progress = [&](const HeadImportance& h) {
    auto partial = to_gui(h);
    publish([&](Snapshot& s) {
      s.importance = partial;
      s.running = true;
    });
  };
  hooks.stop = [this] { return superseded(); };
  hooks.cancel = [this, &r] { return lambda_superseded(r); };
  try {
    const HeadImportance done = run_head_importance(*session_, HeadImportanceRequest{-1, {r.importance_mode}}, hooks);
    auto imp = to_gui(done);
    publish([&](Snapshot& s) {
      s.importance = imp;
      s.running = false;
    });
  } catch (const std::exception& e) {
    report_error(e.what());
  }
}

void Worker::open(const std::string& dir, int64_t plan_tokens) {
  publish([&](Snapshot& s) {
    s.loading = true;
    s.loading_dir = dir;
    s.load_fraction = 0;
    s.load_what = "reading config.json";
  });
  auto last = Clock::now();
  double last_frac = -1;
  auto progress = [&](double fraction, const std::string& what) {
    const auto now = Clock::now();
    if (fraction - last_frac < 0.01 && now - last < std::chrono::milliseconds(50))
      return;
    last = now;
    last_frac = fraction;
    publish([&](Snapshot& s) {
      s.load_fraction = fraction;
      s.load_what = what;
    });
  };
  const auto t0 = Clock::now();
  std::unique_ptr<Session> fresh;
  try {
    fresh = Session::open(dir, backends_, progress, cpu_threads_, gpu_mem_limit_, plan_tokens);
  } catch (const std::exception& e) {
    publish([&](Snapshot& s) {
      s.loading = false;
      s.error = e.what();
      s.error_opening = true;
      s.error_refusal = false;
      ++s.error_seq;
    });
    return;  // the previous model, if any, stays loaded and shown
  }
  session_ = std::move(fresh);
  forget_refused();
  applied_quant_report_ = 0;  // a report asked for (--quantize-logits) is the new model's too
  auto info = std::make_shared<ModelInfo>();
  info->seq = ++model_seq_;
  info->dir = session_->model_dir();
  info->cfg = session_->config();
  info->backend_name = session_->backend().name();
  info->backend_kind = session_->backend().kind();
  info->has_tokenizer = session_->tokenizer() != nullptr;
  info->tokenizer = info->has_tokenizer ? session_->tokenizer()->kind()
                                        : (session_->tokenizer_error().empty() ? std::string("no tokenizer")
                                                                               : session_->tokenizer_error());
  for (int l = 0; l < info->cfg.layers; ++l)
    info->model_lambda.push_back(session_->model_lambda(l));
  info->max_tokens = session_->backend().max_tokens();
  info->eos_ids = session_->eos_ids();
  info->load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  applied_prompt_ = 0;
  head_layer_ = head_head_ = -1;
  ov_ = nullptr;
  reset_generation();
  publish([&](Snapshot& s) {
    s.gen = nullptr;
    s.loading = false;
    s.model = info;
    s.result = nullptr;
    s.head = nullptr;
    s.overview = nullptr;
    s.row = nullptr;
    s.sweep = nullptr;
    s.quant = nullptr;
    s.refused = nullptr;
  });
}

bool Worker::apply_lambda(const LambdaControl& want) {
  const auto& have = session_->lambda_control();
  bool changed = false;
  if (want.scale != have.scale) {
    session_->set_lambda_scale(want.scale);
    changed = true;
  }
  const int L = int(session_->config().layers);
  for (int l = 0; l < L; ++l) {
    const std::optional<double> w = l < int(want.override_.size()) ? want.override_[l] : std::nullopt;
    const std::optional<double> h = l < int(have.override_.size()) ? have.override_[l] : std::nullopt;
    if (w != h) {
      session_->set_lambda_override(l, w);
      changed = true;
    }
  }
  return changed;
}

// [SECTION] run and top-k
// ids_changed: the sequence itself changed (a new prompt, tokens generated or cut back), so no layer of the
// overview survives, whatever layer the run started from.
bool Worker::run_and_publish(bool ids_changed, const Request* r) {
  publish([](Snapshot& s) { s.running = true; });
  const auto t0 = Clock::now();
  int first = 0;
  try {
    if (r)
      first = session_->run(false, [this, r] { return lambda_superseded(*r); });
    else
      first = session_->run();
  } catch (const Cancelled&) {
    return false;
  } catch (const std::exception& e) {
    report_error(e.what());
    return true;
  }
  if (ids_changed && first >= int(session_->config().layers))
    first = 0;  // the sequence changed without a run here (a generation began or was cleared)
  publish_result(first, std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), ids_changed);
  if (const std::string bad = session_->nonfinite_logits(); !bad.empty())
    report_error(bad);  // a banner instead of a plausible-looking top-k
  return true;
}

void Worker::publish_result(int first_layer, double run_ms, bool ids_changed, int64_t decoded) {
  auto res = std::make_shared<RunResult>();
  res->decoded = decoded;
  res->first_layer = first_layer;
  res->run_ms = run_ms;
  res->seq = ++result_seq_;
  res->prompt_len = session_->prompt_length();
  res->model_seq = model_seq_;
  res->ids = session_->ids();
  for (const auto& t : session_->tokens())
    res->tokens.push_back(t.text);
  res->top = session_->top_k(10);
  const int L = int(session_->config().layers);
  for (int l = 0; l < L; ++l)
    res->lambda.push_back(session_->effective_lambda(l));
  res->control = session_->lambda_control();
  res->profile = session_->backend().profile();
  res->interventions = interventions_json(*session_);
  res->logit_bits = session_->logit_bits();
  res->intervention_lines = intervention_lines(*session_);
  if (session_->watching_max_abs_hidden()) {
    try {
      res->max_abs_hidden = session_->max_abs_hidden();
    } catch (const Error&) {  // not read since it was turned on: the next run fills it
    }
  }

  // The overview keeps the layers this run did not recompute (their inputs and lambda are unchanged) when it
  // described the previous result; the rest is computed again by summarize().
  if (!ids_changed && ov_ && ov_->result_seq + 1 == res->seq && int(ov_->layers.size()) == L) {
    for (int l = std::max(0, res->first_layer); l < L; ++l)
      ov_->layers[l] = LayerSummary{};
  } else {
    ov_ = std::make_shared<Overview>();
    ov_->layers.resize(L);
  }
  ov_->result_seq = res->seq;
  ov_->complete = false;
  auto gen = generation_state();
  // While a generation streams the overview on screen stays as it was (summarize() waits for the end): better a
  // grid a few tokens old than an empty one flashing at every token.
  auto ov = streaming_ ? nullptr : std::make_shared<Overview>(*ov_);
  publish([&](Snapshot& s) {
    s.result = res;
    if (ov)
      s.overview = ov;
    s.gen = gen;
  });
}

// [SECTION] generation
// Carries out a generation command; true when the sequence changed (tokens appended or cut back).
bool Worker::generation_command(const Request& r, uint64_t applied_before) {
  switch (r.gen_cmd) {
    case GenCommand::Start:
    case GenCommand::Step: {
      bool began = false;
      // Every Step the worker has not seen yet: at most the Steps that ended the command sequence.
      const int steps = int(std::clamp<uint64_t>(r.gen_seq - applied_before, 1, uint64_t(std::max(1, r.gen_steps))));
      // Step after a Stop (or after max new tokens) goes on from where the continuation ended.
      const bool resumed = r.gen_cmd == GenCommand::Step && !session_->generating() &&
                           session_->continue_generation(steps);
      if (!resumed && (r.gen_cmd == GenCommand::Start || !session_->generating())) {
        session_->begin_generation(r.gen);  // checks the options first: a bad one throws with nothing changed
        archive_continuation();
        cur_ = Continuation{};
        cur_.options = r.gen;
        cur_.lambda = session_->lambda_control();
        cur_.stop_reason = stop_reason_name(session_->stop_reason());
        step_ms_ = 0;
        views_at_ = Clock::now();
        began = true;
      }
      if (r.gen_cmd == GenCommand::Start) {
        set_streaming(session_->generating());
        return began;
      }
      set_streaming(false);
      for (int i = 0; i < steps && session_->generating(); ++i)
        generation_step();
      return true;
    }
    case GenCommand::Stop:
      session_->stop_generation();
      set_streaming(false);
      cur_.stop_reason = stop_reason_name(session_->stop_reason());
      return false;
    case GenCommand::Clear: {
      const bool had = !session_->generated().empty();
      set_streaming(false);
      session_->clear_generation();
      archive_continuation();
      cur_ = Continuation{};
      step_ms_ = 0;
      return had;
    }
    case GenCommand::None:
      break;
  }
  return false;
}

// One token (Session::generate_step), copied into the continuation shown; streaming ends when the session stops.
bool Worker::generation_step() {
  const auto t0 = Clock::now();
  int32_t id = -1;
  try {
    id = session_->generate_step();
  } catch (...) {
    set_streaming(false);
    cur_.stop_reason = stop_reason_name(session_->stop_reason());
    throw;
  }
  step_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const int64_t p = session_->prompt_length();
  cur_.ids = session_->generated();
  cur_.tokens.clear();
  const auto& spans = session_->tokens();
  for (size_t i = size_t(p); i < spans.size(); ++i)
    cur_.tokens.push_back(spans[i].text);
  cur_.text = session_->generated_text();
  cur_.stop_reason = stop_reason_name(session_->stop_reason());
  if (!session_->generating())
    set_streaming(false);
  return id >= 0;
}

// The continuation on screen becomes the one the next is compared with.
void Worker::archive_continuation() {
  if (!cur_.empty())
    before_ = std::make_shared<const Continuation>(cur_);
}

void Worker::reset_generation() {
  set_streaming(false);
  cur_ = Continuation{};
  before_ = nullptr;
  step_ms_ = 0;
}

std::shared_ptr<Generation> Worker::generation_state() const {
  auto g = std::make_shared<Generation>();
  g->prompt_len = session_->prompt_length();
  g->streaming = streaming_;
  g->active = session_->generating();
  g->now = cur_;
  g->before = before_;
  g->step_ms = step_ms_;
  if (before_ && !cur_.empty()) {
    const size_t m = std::min(before_->ids.size(), cur_.ids.size());
    for (size_t i = 0; i < m && g->first_diff < 0; ++i)
      if (before_->ids[i] != cur_.ids[i])
        g->first_diff = int64_t(i);
    // One is a prefix of the other: they differ in length once this one has stopped.
    if (g->first_diff < 0 && !g->active && before_->ids.size() != cur_.ids.size())
      g->first_diff = int64_t(m);
  }
  return g;
}

// [SECTION] the overview: every layer's per-head statistics (Backend::head_stats) and thumbnails
void Worker::summarize(const Request& r) {
  if (!ov_ || ov_->complete || ov_->result_seq != result_seq_)
    return;
  const auto& cfg = session_->config();
  const int L = int(cfg.layers), H = int(cfg.view_heads());
  const int64_t n = int64_t(session_->ids().size());
  const bool thumbs = n <= k_thumb_max_tokens;
  ov_->n = n;
  ov_->note = thumbs ? "" : "no thumbnails above " + std::to_string(k_thumb_max_tokens) + " tokens: map modes show the map's entropy";
  // The selected layer first, so that its row of the grid fills at once.
  std::vector<int> order{int(cfg.nearest_map_layer(r.layer))};
  for (int l = 0; l < L; ++l)
    if (l != order[0] && cfg.has_maps(l))  // layers without attention keep an empty summary
      order.push_back(l);
  for (int l : order) {
    if (!ov_->layers[l].heads.empty())
      continue;
    if (superseded())
      return;  // a newer state is waiting; it continues from here
    LayerSummary ls;
    ls.lambda = session_->effective_lambda(l);
    ls.heads = session_->backend().head_stats(l);
    for (int h = 0; thumbs && h < H; ++h) {
      ViewRequest vr;
      vr.layer = l;
      vr.head = h;
      vr.rows = vr.cols = k_thumb_size;
      vr.pool = Pool::Mean;
      MapView v;
      session_->backend().map_view(vr, v);
      Thumb t;
      t.size = v.rows;
      t.a1 = std::move(v.a1);
      t.a2 = std::move(v.a2);
      t.diff = std::move(v.diff);
      ls.thumbs.push_back(std::move(t));
    }
    ov_->layers[l] = std::move(ls);
    auto partial = std::make_shared<Overview>(*ov_);
    publish([&](Snapshot& s) { s.overview = partial; });
  }
  ov_->complete = true;
  auto done = std::make_shared<Overview>(*ov_);
  publish([&](Snapshot& s) { s.overview = done; });
}

// [SECTION] the selected head: the visible rectangle at the panel's resolution
namespace {
bool same_view(const ViewRequest& a, const ViewRequest& b) {
  return a.q0 == b.q0 && a.q1 == b.q1 && a.k0 == b.k0 && a.k1 == b.k1 && a.rows == b.rows && a.cols == b.cols &&
         a.pool == b.pool;
}
}  // namespace

void Worker::refresh_head(const Request& r) {
  if (!session_->has_result())
    return;
  const ModelConfig& cfg = session_->config();
  const int layer = int(cfg.nearest_view_layer(r.layer));
  const int H = int(cfg.has_scan(layer) ? cfg.d_inner : cfg.view_heads()), head = std::clamp(r.head, 0, H - 1);
  if (layer == head_layer_ && head == head_head_ && head_result_ == result_seq_ && same_view(r.view, head_view_))
    return;
  publish_head(r, std::nullopt);
  head_layer_ = layer;
  head_head_ = head;
  head_result_ = result_seq_;
  head_view_ = r.view;
}

// A lambda change that leaves the layers below the head view's as they were leaves its maps as they were too (a
// layer's maps do not depend on its own lambda): the view under the new lambda is published before the run, so the
// difference map answers at once and the next-token table follows when the run ends.
void Worker::preview_head(const Request& r) {
  const ModelConfig& cfg = session_->config();
  const int layer = int(cfg.nearest_view_layer(r.layer));
  if (!session_->has_result() || !cfg.is_diff() || cfg.has_scan(layer) || session_->stale_from() < layer)
    return;
  publish_head(r, float(session_->effective_lambda(layer)));
}

// The head view of the request: attention layers show their maps, Mamba layers the implicit attention of one
// channel (head = the channel). lambda: the difference's lambda when not the last run's (preview_head).
void Worker::publish_head(const Request& r, std::optional<float> lambda) {
  const ModelConfig& cfg = session_->config();
  const int layer = int(cfg.nearest_view_layer(r.layer));
  const bool implicit = cfg.has_scan(layer);
  const int H = int(implicit ? cfg.d_inner : cfg.view_heads()), head = std::clamp(r.head, 0, H - 1);
  auto hm = std::make_shared<HeadMaps>();
  hm->result_seq = result_seq_;
  hm->layer = layer;
  hm->head = head;
  hm->n = int64_t(session_->ids().size());
  hm->lambda = lambda ? double(*lambda) : session_->head_lambda(layer, head);
  hm->differential = !implicit && cfg.is_diff();
  hm->implicit = implicit;
  hm->window = cfg.layer_window(layer);
  ViewRequest vr = r.view;
  vr.layer = layer;
  vr.head = head;
  vr.lambda = lambda;
  // A rectangle from an older prompt may lie outside this one: clamp it (prepare_view refuses empty ones).
  if (vr.q0 >= hm->n || vr.k0 >= hm->n)
    vr.q0 = vr.k0 = 0, vr.q1 = vr.k1 = -1;
  if (implicit)
    session_->backend().mamba_view(vr, hm->view);
  else
    session_->backend().map_view(vr, hm->view);
  publish([&](Snapshot& s) { s.head = hm; });
}

// [SECTION] the row view: exact rows of one query position, every head of the selected layer
void Worker::refresh_row(const Request& r) {
  if (!session_->has_result())
    return;
  const ModelConfig& cfg = session_->config();
  // As the head view: a Mamba layer gives the row of the selected channel's implicit attention, a GMU layer the
  // nearest attention layer's rows.
  const int sel = int(cfg.nearest_view_layer(r.layer));
  const bool implicit = cfg.has_scan(sel);
  const int layer = implicit ? sel : int(cfg.nearest_map_layer(r.layer));
  const int channel = implicit ? std::clamp(r.head, 0, int(cfg.d_inner) - 1) : -1;
  const int64_t n = int64_t(session_->ids().size());
  const int64_t q = std::clamp<int64_t>(r.row < 0 ? n + r.row : r.row, 0, n - 1);
  {
    auto cur = snapshot()->row;
    if (cur && cur->result_seq == result_seq_ && cur->layer == layer && cur->q == q && cur->channel == channel)
      return;
  }
  auto rm = std::make_shared<RowMaps>();
  rm->result_seq = result_seq_;
  rm->layer = layer;
  rm->q = q;
  rm->implicit = implicit;
  rm->channel = channel;
  if (implicit) {  // the exact row (keys 0..q), the layer's scan inputs recomputed once
    rm->differential = false;
    rm->rows.layer = layer;
    rm->rows.heads = 1;
    rm->rows.n = n;
    rm->rows.positions = {q};
    std::vector<float> row;
    session_->backend().mamba_row(layer, channel, q, row);
    row.resize(size_t(n), 0.f);  // masked keys after q
    rm->rows.a1 = std::move(row);
  } else {
    rm->lambda = session_->head_lambda(layer, std::clamp(r.head, 0, int(cfg.view_heads()) - 1));  // the shown head's
    rm->differential = cfg.is_diff();
    session_->backend().map_rows(layer, {q}, rm->rows);
  }
  publish([&](Snapshot& s) { s.row = rm; });
}

// [SECTION] lambda sweep of the selected layer
void Worker::run_sweep(const Request& r) {
  const int layer = head_layer_, head = head_head_;
  if (layer < 0 || !session_->config().has_maps(layer))  // a Mamba layer in the head view: no lambda to sweep
    return;
  {
    auto cur = snapshot()->sweep;
    if (cur && cur->complete && cur->result_seq == result_seq_ && cur->layer == layer && cur->head == head)
      return;
  }
  if (session_->top_k(1).empty())
    return;
  // The engine's sweep (engine/session/session_sweep.h): the head's entropies in one pass, published whole; the next token's
  // log-probability per value coarse to fine, each published as it comes. A newer request stops it between values
  // (the session is then run back to the user's lambda); a lambda the user has moved on from cancels the run inside
  // a value, and the next request's run brings the session back.
  LambdaSweepRequest q;
  q.layer = layer;
  q.head = head;
  std::tie(q.from, q.to) = default_sweep_range(session_->effective_lambda(layer));
  q.steps = std::max(3, r.sweep_points);
  const uint64_t seq = result_seq_;
  auto to_gui = [&](const LambdaSweep& e) {
    auto sw = std::make_shared<Sweep>();
    sw->result_seq = seq;
    sw->layer = e.layer;
    sw->head = head;
    sw->token = e.token;
    sw->token_text = e.token_text;
    sw->current_lambda = e.current_lambda;
    for (const LambdaSweepPoint& p : e.points) sw->points.push_back({p.lambda, p.logprob, p.entropy.at(0)});
    sw->complete = e.end == LambdaSweep::End::Complete;
    return sw;
  };
  bool first = true;
  LambdaSweepHooks hooks;
  hooks.progress = [&](const LambdaSweep& e) {
    auto partial = to_gui(e);
    publish([&](Snapshot& s) {
      s.sweep = partial;
      if (!first) s.running = true;
    });
    first = false;
  };
  hooks.stop = [this] { return superseded(); };
  hooks.cancel = [this, &r] { return lambda_superseded(r); };
  const LambdaSweep done = run_lambda_sweep(*session_, q, hooks);
  if (done.end == LambdaSweep::End::Cancelled)
    return;
  auto sw = to_gui(done);
  publish([&](Snapshot& s) { s.sweep = sw; });
}

}  // namespace ds::gui
