// The corpus scan on the engine thread (Request::scan_seq; engine/session/session_scan.h): every prompt of a JSONL file
// through ds::scan::Run, one or two runs (the second at another lambda scale of the same model), progress published
// as prompts finish and the report (make_report) re-made every so often and at the end, read out of its JSON into
// plain numbers (ScanRunView) for the Corpus panel. Stop (Request::scan_stop_seq) ends the scan between prompts, or
// inside one (ds::Cancelled): a prompt counts for every run or for none, what was done stays. A bad line or a
// prompt the model refuses is listed with its line number and skipped, never fatal.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/session/session_scan_replicas.h"
#include "worker.h"

namespace ds::gui {

namespace {

using Clock = std::chrono::steady_clock;
namespace sc = ds::scan;

Fractions12 fractions_from(const sc::Fractions& f) {
  Fractions12 out;
  for (int i = 0; i < sc::kNumFractions; ++i)
    out[size_t(i)] = sc::fraction(f, i);
  return out;
}

std::string tag_text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// One run of the report as the Corpus panel shows it.
ScanRunView run_view(const sc::RunReport& j) {
  ScanRunView v;
  v.label = j.label;
  v.lambda_scale = j.lambda_scale;
  v.differential = j.differential;
  v.prompts = j.prompts;
  v.tokens = j.tokens;
  v.with_target = j.with_target;
  v.correct = j.correct;
  v.accuracy = j.accuracy;
  v.mean = fractions_from(j.mean);
  for (const sc::LayerReport& l : j.layers) {
    v.layers.push_back(l.layer);
    v.heads = std::max(v.heads, int(l.heads.size()));
  }
  Fractions12 none;
  none.fill(NAN);
  v.cells.assign(v.layers.size() * size_t(v.heads), none);
  for (size_t li = 0; li < j.layers.size(); ++li)
    for (size_t h = 0; h < j.layers[li].heads.size(); ++h)
      v.cells[li * size_t(v.heads) + h] = fractions_from(j.layers[li].heads[h]);
  for (const auto& [key, arr] : j.groups)
    for (const sc::GroupReport& e : arr) {
      ScanRunView::Group gr;
      gr.key = key;
      gr.value = tag_text(e.value);
      gr.prompts = e.prompts;
      gr.accuracy = e.accuracy;
      gr.mean = fractions_from(e.mean);
      v.groups.push_back(std::move(gr));
    }
  for (const sc::PromptResult& p : j.per_prompt) {
    ScanRunView::Row r;
    r.line = p.line;
    r.tokens = p.tokens;
    r.answer_begin = p.answer_begin;
    r.answer_end = p.answer_end;
    r.mean = fractions_from(p.mean);
    if (p.has_target)
      r.correct = p.correct ? 1 : 0;
    r.target = p.has_target ? p.target : "";
    r.output = p.has_target ? p.output : "";
    r.ms = p.ms;
    if (p.tags.is_object())
      for (auto it = p.tags.begin(); it != p.tags.end(); ++it)
        r.tags += (r.tags.empty() ? "" : " ") + it.key() + "=" + tag_text(it.value());
    v.rows.push_back(std::move(r));
  }
  return v;
}

}  // namespace

const ds::scan::Prompt* ScanState::prompt_at_line(int line) const {
  if (!corpus)
    return nullptr;
  const auto& ps = corpus->prompts;  // in line order
  const auto it = std::lower_bound(ps.begin(), ps.end(), line, [](const sc::Prompt& p, int l) { return p.line < l; });
  return it != ps.end() && it->line == line ? &*it : nullptr;
}

bool Worker::scan_stop_requested(uint64_t stop_seq_at_start) const {
  std::lock_guard lk(mu_);
  // Stop, a newer scan, or the program closing.
  return stop_ || want_.scan_stop_seq != stop_seq_at_start || want_.scan_seq != serving_scan_;
}

void Worker::run_scan(const Request& r) {
  const ScanOptions& o = r.scan;
  {
    std::lock_guard lk(mu_);
    serving_scan_ = r.scan_seq;
  }
  auto st = std::make_shared<ScanState>();
  st->seq = r.scan_seq;
  st->options = o;
  st->running = true;
  auto skipped = std::make_shared<std::vector<sc::LineError>>();
  st->skipped = skipped;
  const auto t0 = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const auto publish_state = [&] {
    st->elapsed_s = elapsed();
    publish_scan(std::make_shared<const ScanState>(*st));
  };
  // The scan could not run (or broke off): one line in the panel and in the error banner.
  const auto fail = [&](const std::string& why) {
    st->running = false;
    st->error = why;
    publish_state();
    report_error(why);
  };
  publish_state();
  if (!session_)
    return fail("no model loaded: open a model first, then scan a corpus");
  std::error_code ec;
  if (o.path.empty())
    return fail("no corpus file: type the path of a JSONL file in the Corpus panel");
  if (std::filesystem::is_directory(o.path, ec))
    return fail(o.path + ": is a folder, not a JSONL corpus file");
  if (!std::filesystem::exists(o.path, ec))
    return fail(o.path + ": no such file (a JSONL corpus: one JSON object a line)");

  std::shared_ptr<const sc::Corpus> corpus;
  std::unique_ptr<sc::ReplicaScan> rs;
  try {
    corpus = std::make_shared<const sc::Corpus>(sc::read_corpus(o.path));
    // The session's sequence and lambda are the scan's now: the continuation is gone, and the lambda is the runs'
    // scale alone (no per-layer overrides, as diffscope-scan). step() brings the session back afterwards.
    reset_generation();
    session_->reset_lambda();
    sc::ReplicaScanOptions ro;
    ro.model = session_->model_dir();
    ro.first_session = session_.get();  // replica 0 is the views' own session; --backend lists add the others
    ro.backends = backends_;
    ro.mem_limit = gpu_mem_limit_;
    if (backends_.size() > 1 || gpu_mem_limit_ > 0)  // the other replicas' splits are placed for the longest prompt
      ro.plan_tokens = sc::corpus_plan_tokens(*corpus, ro.model, o.max_answer_tokens);
    ro.threads = cpu_threads_;
    ro.first = sc::RunOptions{"", o.lambda_scale, o.max_answer_tokens};
    if (o.compare) ro.second = sc::RunOptions{"", o.compare_scale, o.max_answer_tokens};
    rs = std::make_unique<sc::ReplicaScan>(ro);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  st->corpus = corpus;
  st->total = int(corpus->prompts.size());
  st->replicas = int(rs->replicas());
  *skipped = corpus->errors;
  st->skipped = std::make_shared<const std::vector<sc::LineError>>(*skipped);

  const auto make_report = [&](bool complete) {
    auto rep = std::make_shared<ScanReport>();
    rep->report = rs->report(o.path, *skipped, complete, elapsed());
    rep->complete = complete;
    rep->run = run_view(rep->report.run);
    if (rep->report.compare) {
      rep->has_compare = true;
      rep->compare = run_view(*rep->report.compare);
    }
    return std::shared_ptr<const ScanReport>(std::move(rep));
  };

  try {
    const uint64_t stop_seq = r.scan_stop_base;
    std::atomic<bool> enough{false};  // --scan-stop-after N reached
    const std::function<bool()> cancelled = [&] { return enough.load() || scan_stop_requested(stop_seq); };
    Clock::time_point last_publish{}, last_report = t0;
    double report_cost = 0;
    publish_state();
    // Every replica calls back here, one at a time, as a prompt finishes.
    const bool all = rs->run(corpus->prompts, cancelled,
                             [&](const sc::Prompt& p, const sc::PromptResult* res, const std::string* err) {
      st->current_line = p.line;
      if (!res) {  // a prompt this model cannot run (too long, a span outside it, ...): listed, skipped
        const auto at = std::upper_bound(skipped->begin(), skipped->end(), p.line,
                                         [](int l, const sc::LineError& x) { return l < x.line; });
        skipped->insert(at, sc::LineError{p.line, *err});
        st->skipped = std::make_shared<const std::vector<sc::LineError>>(*skipped);
      }
      ++st->tried;
      st->done = int(rs->scanned());
      if (o.stop_after > 0 && st->done >= o.stop_after) enough = true;
      const auto now = Clock::now();
      if (now - last_publish >= std::chrono::milliseconds(100)) {
        // The report costs a pass over every prompt's heads: re-made at most every half second, and less often
        // when it takes long.
        if (now - last_report >= std::chrono::duration<double>(std::max(0.5, 10 * report_cost)) || !st->report) {
          const auto r0 = Clock::now();
          st->report = make_report(false);
          report_cost = std::chrono::duration<double>(Clock::now() - r0).count();
          last_report = Clock::now();
        }
        publish_state();
        last_publish = Clock::now();
      }
    });
    st->stopped = !all;
    st->complete = all && st->tried == st->total;
    st->running = false;
    st->current_line = 0;
    st->report = make_report(st->complete);
    publish_state();
  } catch (const std::exception& e) {
    // Not a prompt's fault (the report, memory, a device): the scan ends here with what it has.
    fail(std::string("corpus scan: ") + e.what());
  }
}

}  // namespace ds::gui
