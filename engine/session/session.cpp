// Session: model + backend + tokenizer + prompt + lambda state. Limits are checked here, before any work.
#include "engine/session/session.h"
#include "engine/session/split_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/safe_write.h"

namespace ds {

std::unique_ptr<Session> Session::open(const std::string& model_dir, BackendChoice choice, const ProgressFn& progress,
                                       int cpu_threads) {
  return open(model_dir, std::vector<BackendChoice>{choice}, progress, cpu_threads, 0);
}

std::unique_ptr<Session> Session::open(const std::string& model_dir, const std::vector<BackendChoice>& backends,
                                       const ProgressFn& progress, int cpu_threads, int64_t gpu_mem_limit,
                                       int64_t plan_tokens) {
  std::unique_ptr<Session> s(new Session());
  std::unique_ptr<Model> model = load_model(model_dir);  // validates everything first
  protect_input_folder(model_dir);  // no tool writes over its files (safe_write.h)
  s->dir_ = model_dir;
  s->cfg_ = model->cfg;
  s->model_lambda_ = model->model_lambda;
  SplitOptions so;
  so.backends = backends;
  so.cpu_threads = cpu_threads;
  so.mem_limit = gpu_mem_limit;
  if (plan_tokens > 0) so.plan_tokens = plan_tokens;
  s->backend_ = make_backend_for(so);
  s->backend_->load(*model, progress);
  model.reset();  // weights now live in the backend; release the mapping
  try {
    s->tok_ = find_tokenizer(model_dir);
    if (!s->tok_) s->tok_error_ = "no tokenizer.json or tokenizer.model in " + model_dir + ": token ids only";
  } catch (const Error& e) {
    s->tok_error_ = e.what();
  }
  s->eos_ = generation_eos_ids(model_dir, s->cfg_.eos_ids);
  s->lam_.override_.assign(size_t(s->cfg_.layers), std::nullopt);
  s->ran_lambda_.assign(size_t(s->cfg_.layers), NAN);
  return s;
}

void Session::set_prompt(const std::string& text) {
  if (!tok_) throw Error("cannot tokenize a prompt: " + (tok_error_.empty() ? "no tokenizer" : tok_error_));
  // Text that cannot fit is refused before the tokenizer sees it (tokenizing costs ~100 bytes of memory a byte):
  // no vocabulary's tokens average 256 bytes.
  constexpr int64_t kMaxBytesPerToken = 256;
  if (int64_t(text.size()) > cfg_.max_positions * kMaxBytesPerToken)
    throw Error("the prompt is " + std::to_string(text.size()) + " bytes of text, more than this model's " +
                std::to_string(cfg_.max_positions) + " positions can hold (max_position_embeddings; at most " +
                std::to_string(kMaxBytesPerToken) + " bytes a token)");
  std::vector<TokenSpan> spans = tok_->encode_spans(text, true);
  std::vector<int32_t> ids;
  for (const TokenSpan& t : spans) ids.push_back(t.id);
  set_ids(ids);
  spans_ = std::move(spans);
}

void Session::set_ids(const std::vector<int32_t>& ids) {
  if (ids.empty()) throw Error("the prompt is empty: nothing to run");
  for (int32_t id : ids)
    if (id < 0 || id >= cfg_.vocab)
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(cfg_.vocab - 1) + ")");
  const int64_t n = int64_t(ids.size());
  if (n > cfg_.max_positions)
    throw Error("the prompt is " + std::to_string(n) + " tokens; this model allows at most " +
                std::to_string(cfg_.max_positions) + " (max_position_embeddings)");
  const int64_t cap = backend_->max_tokens();
  if (n > cap)
    throw Error("the prompt is " + std::to_string(n) + " tokens; the " + backend_->kind() +
                " backend has memory for at most " + std::to_string(cap) + " with this model");
  // The knockouts in force must fit it: a span it does not hold is refused here, with the prompt and result as they
  // were (not at the next run, with the new tokens and the old result).
  for (const Knockout& k : knockouts_) ds::resolve_knockout(k, n, n);
  ids_ = ids;
  prompt_len_ = n;
  gen_active_ = false;
  gen_count_ = 0;
  stop_ = StopReason::None;
  spans_.clear();
  for (int32_t id : ids_) {
    TokenSpan t;
    t.id = id;
    t.text = tok_ ? tok_->token_text(id) : "#" + std::to_string(id);
    spans_.push_back(t);
  }
  ids_dirty_ = true;
}

double Session::model_lambda(int layer) const {
  return cfg_.is_diff() ? model_lambda_.at(size_t(layer)) : 0.0;
}

double Session::effective_lambda(int layer) const {
  if (!cfg_.is_diff() || !cfg_.has_maps(layer)) return 0.0;
  const auto& o = lam_.override_.at(size_t(layer));
  return o ? *o : lam_.scale * model_lambda_.at(size_t(layer));
}

void Session::set_lambda_scale(double s) {
  if (!std::isfinite(s)) throw Error("lambda scale must be a finite number");
  lam_.scale = s;
}

void Session::set_lambda_override(int layer, std::optional<double> value) {
  if (layer < 0 || layer >= cfg_.layers)
    throw Error("layer " + std::to_string(layer) + " does not exist (the model has " + std::to_string(cfg_.layers) +
                " layers: 0.." + std::to_string(cfg_.layers - 1) + ")");
  if (value && !std::isfinite(*value)) throw Error("lambda must be a finite number");
  if (value && !cfg_.has_maps(layer)) throw Error(cfg_.no_attention(layer, "lambda"));
  lam_.override_[size_t(layer)] = value;
}

void Session::reset_lambda() {
  lam_.scale = 1.0;
  std::fill(lam_.override_.begin(), lam_.override_.end(), std::nullopt);
}

std::vector<float> Session::run_lambda() const {
  std::vector<float> lam(static_cast<size_t>(cfg_.layers));
  for (int l = 0; l < int(cfg_.layers); ++l) lam[size_t(l)] = float(effective_lambda(l));
  return lam;
}

std::string Session::nonfinite_logits() const {
  if (!has_result_) return "";
  const ForwardResult& r = result();
  const size_t V = size_t(cfg_.vocab);
  if (r.logits.size() < V) return "";
  size_t bad = 0;
  for (size_t i = r.logits.size() - V; i < r.logits.size(); ++i) bad += !std::isfinite(r.logits[i]);
  if (!bad) return "";
  return "the last position's logits are not finite (" + std::to_string(bad) + " of " + std::to_string(V) +
         " are NaN or Inf): the weights hold non-finite values or lambda is so large that the model overflows";
}

int Session::stale_from() const {
  if (ids_dirty_ || !has_result_ || reader_dirty_) return 0;
  const int L = int(cfg_.layers);
  const std::vector<float> lam = run_lambda();
  for (int l = 0; l < L; ++l)
    if (!(lam[size_t(l)] == ran_lambda_[size_t(l)]) || l >= writers_stale_from_) return l;
  return all_rows_wanted_ && !every_row_ ? L - 1 : L;
}

int Session::run_bulk(const std::function<bool()>& cancel, int keep_attention) {
  bulk_ = keep_attention;
  try {
    const int from = run(false, cancel, false);
    bulk_.reset();
    return from;
  } catch (...) {
    bulk_.reset();
    throw;
  }
}

int Session::run(bool all_logits, const std::function<bool()>& cancel, bool cancel_new_prompt) {
  if (ids_.empty()) throw Error("no prompt: give a prompt or token ids first");
  const int L = int(cfg_.layers);
  const std::vector<float> lam = run_lambda();
  const bool want_all = all_logits && (!has_result_ || res_.logit_rows != int64_t(ids_.size()));
  const int from = want_all ? 0 : stale_from();
  if (from == L && !logits_stale_) return L;
  ForwardRequest req;
  req.hooks = hooks_;
  req.ids = ids_;
  req.lambda = lam;
  req.from_layer = from;
  {
    std::shared_ptr<const std::vector<fwd::AttnEdit>> e = resolve_edits(int64_t(ids_.size()));
    if (!e || !edits_ || *e != *edits_) edits_ = std::move(e);  // the same edits keep their object (CUDA graphs)
    req.edits = edits_;
  }
  req.all_logits = all_logits;
  req.logits_on_demand = bulk_.has_value() && !all_logits;
  req.profile = !bulk_ && profiled_;
  req.keep_attention = bulk_.value_or(-1);
  req.all_rows = all_rows_wanted_;
  const bool rerun = !ids_dirty_ && has_result_;
  if (cancel && (rerun || cancel_new_prompt)) req.cancel = cancel;
  try {
    backend_->forward(req, res_);
  } catch (const ForwardCancelled& c) {
    if (!rerun) {  // a new prompt stopped halfway: none of it is kept, and the caches no longer hold the old one
      has_result_ = false;
      ids_dirty_ = true;
      maps_cache_.clear();
      throw;
    }
    // Layers below c.layer ran with this lambda; from c.layer on they are stale (NaN never equals a lambda), and the
    // logits are the previous run's until the next run.
    for (int l = 0; l < L; ++l)
      ran_lambda_[size_t(l)] = l < c.layer ? lam[size_t(l)] : std::numeric_limits<float>::quiet_NaN();
    writers_stale_from_ = 1 << 30;  // the layers below c.layer ran with the writers in force; the rest are NaN-stale
    logits_stale_ = true;
    maps_cache_.resize(size_t(L));
    for (int l = std::max(0, std::min(from, c.layer)); l < L; ++l) maps_cache_[size_t(l)] = LayerMaps{};
    throw;
  }
  has_result_ = true;
  every_row_ = all_logits || all_rows_wanted_ || (hooks_ && hooks_->needs_all_rows());
  ids_dirty_ = false;
  reader_dirty_ = false;
  writers_stale_from_ = 1 << 30;
  logits_stale_ = false;
  ran_lambda_ = lam;
  // Maps of layer l depend only on layers < l: those up to `from` stay valid.
  maps_cache_.resize(size_t(L));
  for (int l = from + 1; l < L; ++l) maps_cache_[size_t(l)] = LayerMaps{};
  if (from == 0) maps_cache_[0] = LayerMaps{};
  return from;
}

void Session::run_every_row() {
  all_rows_wanted_ = true;
  try {
    run();
  } catch (...) {
    all_rows_wanted_ = false;
    throw;
  }
  all_rows_wanted_ = false;
}

void Session::rebuild_hooks() {
  if (!watch_max_abs_ && head_scales_.empty() && head_means_.empty()) {
    hooks_ = nullptr;
    return;
  }
  auto h = std::make_shared<fwd::Hooks>();
  for (const HeadScale& x : head_scales_) h->add(fwd::scale_head_hook(cfg_, x.layer, x.head, x.factor));
  for (size_t i = 0; i < head_means_.size(); ++i)
    h->add(fwd::mean_head_hook(cfg_, head_means_[i].first, head_means_[i].second, int(i)));
  if (watch_max_abs_) h->add(fwd::max_abs_hidden_hook());
  hooks_ = std::move(h);
}

void Session::set_watch_max_abs_hidden(bool on) {
  if (on == watch_max_abs_) return;
  watch_max_abs_ = on;
  if (on) reader_dirty_ = true;  // layers that earlier runs left were not read
  rebuild_hooks();
}

void check_view_head(const ModelConfig& cfg, int layer, int head, const char* what) {
  if (layer < 0 || layer >= cfg.layers)
    throw Error("layer " + std::to_string(layer) + " does not exist (the model has " + std::to_string(cfg.layers) +
                " layers)");
  if (!cfg.has_maps(layer)) throw Error(cfg.no_attention(layer, what));
  if (head < 0 || head >= cfg.view_heads())
    throw Error("head " + std::to_string(head) + " does not exist (layers have " + std::to_string(cfg.view_heads()) +
                " view heads)");
}

void Session::set_head_scale(int layer, int head, std::optional<float> factor) {
  check_view_head(cfg_, layer, head, "heads to ablate");
  if (factor && !std::isfinite(*factor))
    throw Error("a head's scale must be a finite number within the float range (|x| < 3.4e38)");
  auto it = std::find_if(head_scales_.begin(), head_scales_.end(),
                         [&](const HeadScale& x) { return x.layer == layer && x.head == head; });
  if (!factor && it == head_scales_.end()) return;
  if (factor && it != head_scales_.end() && it->factor == *factor) return;
  if (!factor) head_scales_.erase(it);
  else if (it != head_scales_.end()) it->factor = *factor;
  else head_scales_.push_back({layer, head, *factor});
  writers_stale_from_ = std::min<int64_t>(writers_stale_from_, layer);
  rebuild_hooks();
}

bool Session::set_head_scales(const std::vector<HeadScale>& want) {
  if (want == head_scales_) return false;
  const std::vector<HeadScale> have = head_scales_;
  for (const HeadScale& h : have)  // those no longer wanted
    if (std::none_of(want.begin(), want.end(), [&](const HeadScale& w) { return w.layer == h.layer && w.head == h.head; }))
      set_head_scale(h.layer, h.head, std::nullopt);
  for (const HeadScale& w : want) set_head_scale(w.layer, w.head, w.factor);
  return head_scales_ != have;
}

void Session::clear_head_scales() {
  for (const HeadScale& x : head_scales_) writers_stale_from_ = std::min<int64_t>(writers_stale_from_, x.layer);
  head_scales_.clear();
  rebuild_hooks();
}


void Session::set_head_mix(int layer, int head, bool drop_a1, std::optional<float> lambda) {
  if (!cfg_.is_diff())
    throw Error("this model's heads are not differential: dropping A1 or A2 and a head's own lambda need two maps a "
                "head; HINT: ablate the whole head (mode head)");
  check_view_head(cfg_, layer, head,
                  lambda && *lambda != 0.f && !drop_a1 ? "heads with a lambda" : "heads to ablate");
  if (lambda && !std::isfinite(*lambda))
    throw Error("a head's lambda must be a finite number within the float range (|x| < 3.4e38)");
  auto it = std::find_if(head_mixes_.begin(), head_mixes_.end(),
                         [&](const HeadMix& x) { return x.layer == layer && x.head == head; });
  const bool none = !drop_a1 && !lambda;
  if (none && it == head_mixes_.end()) return;
  if (!none && it != head_mixes_.end() && it->drop_a1 == drop_a1 && it->lambda == lambda) return;
  if (none) head_mixes_.erase(it);
  else if (it != head_mixes_.end()) it->drop_a1 = drop_a1, it->lambda = lambda;
  else head_mixes_.push_back({layer, head, drop_a1, lambda});
  writers_stale_from_ = std::min<int64_t>(writers_stale_from_, layer);
}

double Session::head_lambda(int layer, int head) const {
  for (const HeadMix& m : head_mixes_)
    if (m.layer == layer && m.head == head && m.lambda) return double(*m.lambda);
  return effective_lambda(layer);
}

void Session::set_head_lambda(int layer, int head, std::optional<float> lambda) {
  const auto it = std::find_if(head_mixes_.begin(), head_mixes_.end(),
                               [&](const HeadMix& x) { return x.layer == layer && x.head == head; });
  set_head_mix(layer, head, it != head_mixes_.end() && it->drop_a1, lambda);
}

bool Session::set_head_mixes(const std::vector<HeadMix>& want) {
  if (want == head_mixes_) return false;
  const std::vector<HeadMix> have = head_mixes_;
  for (const HeadMix& h : have)
    if (std::none_of(want.begin(), want.end(), [&](const HeadMix& w) { return w.layer == h.layer && w.head == h.head; }))
      set_head_mix(h.layer, h.head, false, std::nullopt);
  for (const HeadMix& w : want) set_head_mix(w.layer, w.head, w.drop_a1, w.lambda);
  return head_mixes_ != have;
}

void check_knockout(const ModelConfig& c, const Knockout& k) {
  const int L = int(c.layers);
  if (k.layer0 >= 0 && k.layer1 <= L && k.layer0 >= k.layer1)
    throw Error("knockout layers " + std::to_string(k.layer0) + ".." + std::to_string(k.layer1 - 1) +
                ": the range is reversed");
  if (k.layer0 < 0 || k.layer1 > L)
    throw Error("knockout layers " + std::to_string(k.layer0) + ".." + std::to_string(k.layer1 - 1) +
                " are not layers of the model (0.." + std::to_string(L - 1) + ")");
  bool any = false;
  for (int l = k.layer0; l < k.layer1; ++l) any |= c.has_maps(l);
  if (!any) throw Error(c.no_attention(k.layer0, "keys to knock out"));
  // A span is [a, b) from the start (0 <= a < b), from the end (a < b < 0), or from a to the end (a < 0, b = 0;
  // a >= 0, b = Knockout::kToEnd).
  auto check = [](int64_t a, int64_t b, const char* what) {
    const bool ok = (a >= 0 && b > a) || (a < 0 && (b == 0 || (b < 0 && b > a)));
    if (!ok)
      throw Error(std::string("knockout ") + what + " span " + std::to_string(a) + ":" + std::to_string(b) +
                  (a >= 0 && b < 0 ? " mixes positions from the start and from the end" : " is empty or reversed"));
  };
  check(k.q0, k.q1, "query");
  check(k.k0, k.k1, "key");
}

void Session::add_knockout(const Knockout& k) {
  check_knockout(cfg_, k);  // its spans against the sequence when a run resolves them (diffscope-run and the GUI
                            // check them against their prompt first: resolve_knockout)
  if (std::find(knockouts_.begin(), knockouts_.end(), k) != knockouts_.end()) return;
  knockouts_.push_back(k);
  writers_stale_from_ = std::min<int64_t>(writers_stale_from_, k.layer0);
}

bool Session::set_knockouts(const std::vector<Knockout>& want) {
  if (want == knockouts_) return false;
  const std::vector<Knockout> have = knockouts_;
  knockouts_.clear();
  try {
    for (const Knockout& k : want) add_knockout(k);  // (a repeated one is kept once)
  } catch (...) {
    knockouts_ = have;
    throw;
  }
  if (knockouts_ == have) return false;
  for (const Knockout& k : have) writers_stale_from_ = std::min<int64_t>(writers_stale_from_, k.layer0);
  return true;
}

void Session::set_head_mean(int layer, int head, bool on) {
  check_view_head(cfg_, layer, head, "heads to ablate");
  const std::pair<int, int> x{layer, head};
  const auto it = std::find(head_means_.begin(), head_means_.end(), x);
  if (on == (it != head_means_.end())) return;
  if (on) head_means_.push_back(x);
  else head_means_.erase(it);
  writers_stale_from_ = std::min<int64_t>(writers_stale_from_, layer);
  // The slots are the list's order: every mean hook after a removed one moves, so the layers from the first of them
  // on run again (their means are recomputed into their new slots).
  for (const auto& m : head_means_) writers_stale_from_ = std::min<int64_t>(writers_stale_from_, m.first);
  rebuild_hooks();
}

bool Session::set_head_means(const std::vector<std::pair<int, int>>& want) {
  if (want == head_means_) return false;
  const std::vector<std::pair<int, int>> have = head_means_;
  for (const auto& m : have)  // those no longer wanted, then the new ones (a repeated one is kept once)
    if (std::find(want.begin(), want.end(), m) == want.end()) set_head_mean(m.first, m.second, false);
  for (const auto& m : want) set_head_mean(m.first, m.second, true);
  return head_means_ != have;
}

void Session::ablate(int layer, int head, const std::string& mode) {
  if (mode == "head") return set_head_scale(layer, head, 0.f);
  if (mode == "mean") return set_head_mean(layer, head, true);
  if (mode != "a1" && mode != "a2")
    throw Error("ablation mode '" + mode + "' is not known (modes: a1, a2, head, mean)");
  if (mode == "a2") return set_head_lambda(layer, head, 0.f);
  auto it = std::find_if(head_mixes_.begin(), head_mixes_.end(),
                         [&](const HeadMix& x) { return x.layer == layer && x.head == head; });
  set_head_mix(layer, head, true, it != head_mixes_.end() ? it->lambda : std::nullopt);
}

void Session::clear_interventions() {
  clear_head_scales();
  set_head_means({});
  set_head_mixes({});
  set_knockouts({});
}

void Session::set_logit_bits(int bits) {
  if (bits != 0 && (bits < 2 || bits > 16))
    throw Error("quantised logits: " + std::to_string(bits) + " bits is outside 2..16 (0: full precision)");
  if (bits == logit_bits_) return;
  logit_bits_ = bits;
  writers_stale_from_ = 0;
}

std::shared_ptr<const std::vector<fwd::AttnEdit>> Session::resolve_edits(int64_t n) const {
  if (head_mixes_.empty() && knockouts_.empty() && logit_bits_ == 0) return nullptr;
  const int L = int(cfg_.layers), Hv = int(cfg_.view_heads());
  auto e = std::make_shared<std::vector<fwd::AttnEdit>>(size_t(L));
  for (int l = 0; l < L; ++l)
    if (cfg_.has_maps(l)) (*e)[size_t(l)].logit_bits = logit_bits_;
  for (const HeadMix& m : head_mixes_) {
    fwd::AttnEdit& x = (*e)[size_t(m.layer)];
    if (x.a1.empty()) x.a1.assign(size_t(Hv), 1.f), x.lambda.assign(size_t(Hv), std::nanf(""));
    if (m.drop_a1) x.a1[size_t(m.head)] = 0.f;
    if (m.lambda) x.lambda[size_t(m.head)] = *m.lambda;
  }
  // Negative positions count from the prompt's end (generated tokens do not move them); an open end reaches past
  // every position there will be (the decoding steps' rows and keys included).
  for (const Knockout& k : knockouts_) {
    const fwd::KeySpan r = resolve_knockout(k, n);
    for (int l = k.layer0; l < k.layer1; ++l)
      if (cfg_.has_maps(l)) (*e)[size_t(l)].knockout.push_back(r);
  }
  return e;
}

fwd::KeySpan Session::resolve_knockout(const Knockout& k, int64_t n) const {
  return ds::resolve_knockout(k, n, prompt_len_ > 0 ? prompt_len_ : n);
}

fwd::KeySpan resolve_knockout(const Knockout& k, int64_t n, int64_t prompt_len) {
  const int64_t P = std::min<int64_t>(prompt_len, n);
  constexpr int64_t kOpen = std::numeric_limits<int32_t>::max();
  auto at = [n, P](int64_t a, int64_t b, const char* what) {
    const bool open = (a < 0 && b == 0) || b == Knockout::kToEnd;
    const int64_t lo = a < 0 ? P + a : a, hi = open ? kOpen : b < 0 ? P + b : b;
    const std::string span = std::to_string(a) + ":" + (b == Knockout::kToEnd ? std::string() : std::to_string(b));
    if (lo < 0 || lo >= n || (!open && hi > n))
      throw Error(std::string("knockout ") + what + " span " + span + " is outside the prompt's " + std::to_string(n) +
                  " tokens");
    if (lo >= hi) throw Error(std::string("knockout ") + what + " span " + span + " is empty or reversed");
    return std::pair<int64_t, int64_t>{lo, hi};
  };
  const auto q = at(k.q0, k.q1, "query"), kk = at(k.k0, k.k1, "key");
  return {q.first, q.second, kk.first, kk.second};
}

Knockout parse_knockout(const std::string& spec, int layers) {
  // L:Q0:Q1,K0:K1 with L a layer, a range a-b or "all"; Q1 / K1 may be empty (to the end).
  auto bad = [&](const std::string& why) { return Error("knockout " + spec + ": " + why + " (want L:Q0:Q1,K0:K1)"); };
  const size_t comma = spec.find(',');
  const size_t c1 = spec.find(':');
  if (comma == std::string::npos || c1 == std::string::npos || c1 > comma) throw bad("malformed");
  const std::string ls = spec.substr(0, c1), qs = spec.substr(c1 + 1, comma - c1 - 1), ks = spec.substr(comma + 1);
  auto num = [&](const std::string& t, bool open_ok) -> int64_t {
    if (t.empty()) {
      if (open_ok) return 0;
      throw bad("a position is missing");
    }
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(t, &used);
    } catch (...) {
      throw bad("'" + t + "' is not a position");
    }
    if (used != t.size()) throw bad("'" + t + "' is not a position");
    return v;
  };
  auto span = [&](const std::string& t, int64_t& a, int64_t& b) {
    const size_t c = t.find(':');
    if (c == std::string::npos) throw bad("a span is FROM:TO");
    a = num(t.substr(0, c), false);
    b = num(t.substr(c + 1), true);
    if (c + 1 == t.size() && a >= 0) b = Knockout::kToEnd;  // "5:": from 5 to the end (a negative start: b = 0)
  };
  auto layer = [&](const std::string& t) {  // (checked before the cast: 2^32 + 1 is not layer 1)
    const int64_t v = num(t, false);
    if (v < 0 || v >= layers)
      throw bad("layer " + t + " is not a layer of the model (0.." + std::to_string(layers - 1) + ")");
    return int(v);
  };
  Knockout k;
  if (ls == "all") {
    k.layer0 = 0, k.layer1 = layers;
  } else if (const size_t dash = ls.find('-'); dash != std::string::npos && dash > 0) {
    k.layer0 = layer(ls.substr(0, dash));
    k.layer1 = layer(ls.substr(dash + 1)) + 1;
    if (k.layer1 <= k.layer0) throw bad("the layer range " + ls + " is reversed");
  } else {
    k.layer0 = layer(ls);
    k.layer1 = k.layer0 + 1;
  }
  span(qs, k.q0, k.q1);
  span(ks, k.k0, k.k1);
  return k;
}

std::string knockout_text(const Knockout& k) {
  auto end = [](int64_t a, int64_t b) {
    return (a < 0 && b == 0) || b == Knockout::kToEnd ? std::string() : std::to_string(b);
  };
  const std::string l = k.layer1 - k.layer0 == 1 ? std::to_string(k.layer0)
                                                 : std::to_string(k.layer0) + "-" + std::to_string(k.layer1 - 1);
  return l + ":" + std::to_string(k.q0) + ":" + end(k.q0, k.q1) + "," + std::to_string(k.k0) + ":" + end(k.k0, k.k1);
}

std::vector<float> Session::max_abs_hidden() const {
  if (!watch_max_abs_) throw Error("max_abs_hidden: the reader is off; HINT: turn it on (set_watch_max_abs_hidden) and run");
  if (!has_result_ || reader_dirty_) throw Error("max_abs_hidden: no run since the reader was turned on");
  std::vector<float> v = backend_->layer_max_abs();
  if (v.size() != size_t(cfg_.layers)) throw Error("max_abs_hidden: the last forward ran without the reader");
  return v;
}

const LayerMaps& Session::maps(int layer) {
  if (!has_result_) throw Error("no result yet: run the model first");
  if (layer < 0 || layer >= cfg_.layers) throw Error("layer " + std::to_string(layer) + " does not exist");
  if (!cfg_.has_maps(layer)) throw Error(cfg_.no_attention(layer, "attention maps"));
  LayerMaps& m = maps_cache_[size_t(layer)];
  if (m.empty()) backend_->layer_maps(layer, m);
  return m;
}

void Session::ensure_logits() const {
  if (has_result_ && res_.logits.empty() && res_.logit_rows > 0) backend_->fetch_logits(res_);
}

namespace {
// log sum exp of a logit row: exponentials in float (a third of double's time over a 128K vocabulary: head importance
// takes one per ablation), summed in float over blocks of 512 and the blocks in double.
float log_sum_exp(const float* row, int64_t V) {
  const float mx = *std::max_element(row, row + V);
  double s = 0;
  for (int64_t i0 = 0; i0 < V; i0 += 512) {
    float part = 0.f;
    for (int64_t i = i0, e = std::min<int64_t>(V, i0 + 512); i < e; ++i) part += std::exp(row[i] - mx);
    s += double(part);
  }
  return mx + float(std::log(s));
}
}  // namespace

double Session::next_token_logprob(int32_t id) const {
  if (id < 0 || id >= cfg_.vocab)
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(cfg_.vocab) + ")");
  if (!has_result_) return std::numeric_limits<double>::quiet_NaN();
  ensure_logits();
  const float* row = res_.logits.data() + (res_.logit_rows - 1) * cfg_.vocab;
  return double(row[id] - log_sum_exp(row, cfg_.vocab));
}

void Session::queue_next_token_logprob(int32_t id, int slot) {
  if (id < 0 || id >= cfg_.vocab)
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(cfg_.vocab) + ")");
  if (slot < 0 || slot >= kLogprobSlots) throw Error("internal: log-probability slot " + std::to_string(slot));
  if (queued_logp_.size() <= size_t(slot)) queued_logp_.resize(size_t(slot) + 1, 0.0), queued_dev_.resize(size_t(slot) + 1, 0);
  const bool device = has_result_ && res_.logits.empty() && backend_->queue_logprob(id, slot);
  queued_dev_[size_t(slot)] = device;
  queued_logp_[size_t(slot)] = device ? 0.0 : next_token_logprob(id);
}

std::vector<double> Session::take_queued_logprobs(int count) {
  if (count < 0 || size_t(count) > queued_logp_.size())
    throw Error("internal: " + std::to_string(count) + " queued log-probabilities");
  std::vector<double> out(queued_logp_.begin(), queued_logp_.begin() + count);
  if (std::find(queued_dev_.begin(), queued_dev_.begin() + count, uint8_t(1)) != queued_dev_.begin() + count) {
    const std::vector<double> dev = backend_->take_logprobs(count);
    for (int i = 0; i < count; ++i)
      if (queued_dev_[size_t(i)]) out[size_t(i)] = dev.at(size_t(i));
  }
  queued_logp_.clear();
  queued_dev_.clear();
  return out;
}

std::vector<float> Session::next_token_logprobs() const {
  if (!has_result_) return {};
  ensure_logits();
  const int64_t V = cfg_.vocab;
  const float* row = res_.logits.data() + (res_.logit_rows - 1) * V;
  const float lse = log_sum_exp(row, V);
  std::vector<float> lp(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) lp[size_t(i)] = row[i] - lse;
  return lp;
}

std::vector<TopToken> Session::top_k(int k) const {
  std::vector<float> lp = next_token_logprobs();
  if (lp.empty()) return {};
  const int64_t V = cfg_.vocab;
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  k = int(std::min<int64_t>(k, V));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return lp[size_t(a)] > lp[size_t(b)]; });
  const float* row = res_.logits.data() + (res_.logit_rows - 1) * V;
  std::vector<TopToken> out;
  for (int i = 0; i < k; ++i) {
    const int32_t id = idx[size_t(i)];
    out.push_back({id, std::exp(lp[size_t(id)]), row[id], tok_ ? tok_->token_text(id) : "#" + std::to_string(id)});
  }
  return out;
}

std::string Session::token_label(int position) const {
  if (position < 0 || size_t(position) >= spans_.size()) return "?";
  return spans_[size_t(position)].text;
}

// --- generation

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::None: return "";
    case StopReason::Eos: return "eos";
    case StopReason::MaxTokens: return "max_tokens";
    case StopReason::ContextFull: return "context_full";
    case StopReason::Stopped: return "stopped";
  }
  return "";
}

std::vector<int32_t> Session::generated() const {
  return std::vector<int32_t>(ids_.begin() + std::min<int64_t>(prompt_len_, int64_t(ids_.size())), ids_.end());
}

std::string Session::generated_text() const { return tok_ ? tok_->decode(generated()) : std::string(); }

void Session::clear_generation() {
  gen_active_ = false;
  gen_count_ = 0;
  stop_ = StopReason::None;
  if (int64_t(ids_.size()) <= prompt_len_) return;
  ids_.resize(size_t(prompt_len_));
  spans_.resize(size_t(prompt_len_));
  for (LayerMaps& m : maps_cache_) m = LayerMaps{};
  // Cut the backend's caches back to the prompt where it can (attention only); a recurrent layer's state cannot
  // be cut, so the prompt then runs again.
  if (has_result_ && !ids_dirty_ && backend_->truncate(prompt_len_)) logits_stale_ = true;
  else ids_dirty_ = true;
  if (watch_max_abs_) reader_dirty_ = true;  // the reader's slots hold the cut positions too: read the prompt again
  if (has_result_) run();
}

void Session::stop_generation() {
  if (gen_active_) set_stop(StopReason::Stopped);
}

bool Session::continue_generation(int more) {
  if (gen_active_ || more <= 0 || int64_t(ids_.size()) <= prompt_len_) return false;
  if (stop_ == StopReason::Eos || stop_ == StopReason::ContextFull) return false;
  gen_opt_.max_new = gen_count_ + more;
  stop_ = StopReason::None;
  gen_active_ = true;
  return true;
}

void Session::begin_generation(const GenerateOptions& o) {
  check_sampling(o.sampling);
  if (o.max_new < 0) throw Error("the number of tokens to generate must be >= 0");
  if (ids_.empty()) throw Error("no prompt: give a prompt or token ids first");
  clear_generation();
  gen_opt_ = o;
  sampler_ = Sampler(o.sampling);
  gen_count_ = 0;
  stop_ = StopReason::None;
  gen_active_ = true;
  gen_cap_ = backend_->max_tokens();  // memory at the start; a step that needs more fails with the backend's error
  run();
  if (o.max_new == 0) set_stop(StopReason::MaxTokens);
}

int32_t Session::generate_step() {
  if (!gen_active_) return -1;
  run();  // a lambda changed since the last step: the sequence so far re-runs from that layer first
  const int64_t n = int64_t(ids_.size());
  if (n + 1 > cfg_.max_positions || n + 1 > gen_cap_) {
    set_stop(StopReason::ContextFull);
    return -1;
  }
  const int64_t V = cfg_.vocab;
  // Greedy steps take the backend's own choice when it left the logits on the device (8 bytes instead of the
  // vocabulary's logits per token); anything else picks from the logits here.
  const bool greedy = gen_opt_.sampling.greedy();
  int32_t id = res_.argmax;
  if (!greedy || !res_.logits.empty() || id < 0) {
    ensure_logits();
    id = sampler_.pick(res_.logits.data() + (res_.logit_rows - 1) * V, V);
  }
  ForwardRequest req;
  req.ids = ids_;
  req.ids.push_back(id);
  req.lambda = ran_lambda_;
  req.hooks = hooks_;
  req.edits = edits_;
  req.append_from = n;  // (quantised logits too: every backend's decoding step takes them)
  req.logits_on_demand = greedy;
  try {
    backend_->forward(req, res_);
  } catch (...) {
    ids_dirty_ = true;  // the backend may hold part of the step: the next run starts over
    has_result_ = false;
    set_stop(StopReason::Stopped);
    throw;
  }
  ids_.push_back(id);
  TokenSpan t;
  t.id = id;
  t.text = tok_ ? tok_->token_text(id) : "#" + std::to_string(id);
  t.special = std::find(eos_.begin(), eos_.end(), id) != eos_.end();
  spans_.push_back(t);
  for (LayerMaps& m : maps_cache_) m = LayerMaps{};  // n grew: every cached map is a size too small
  ++gen_count_;
  if (gen_opt_.stop_at_eos && t.special) set_stop(StopReason::Eos);
  else if (gen_count_ >= gen_opt_.max_new) set_stop(StopReason::MaxTokens);
  return id;
}

std::vector<int32_t> Session::generate(const GenerateOptions& o, const std::function<bool(int32_t)>& on_token) {
  begin_generation(o);
  while (gen_active_) {
    const int32_t id = generate_step();
    if (id < 0) break;
    if (on_token && !on_token(id)) stop_generation();
  }
  return generated();
}

}  // namespace ds
