// Session: model + backend + tokenizer + prompt + lambda state. Limits are checked here, before any work.
#include "engine/session/session.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/core/error.h"

namespace ds {

std::unique_ptr<Session> Session::open(const std::string& model_dir, BackendChoice choice, const ProgressFn& progress,
                                       int cpu_threads) {
  std::unique_ptr<Session> s(new Session());
  std::unique_ptr<Model> model = load_model(model_dir);  // validates everything first
  s->dir_ = model_dir;
  s->cfg_ = model->cfg;
  s->model_lambda_ = model->model_lambda;
  s->backend_ = make_backend(choice, cpu_threads);
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
  return L;
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
  req.all_logits = all_logits;
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

void Session::rebuild_hooks() {
  if (!watch_max_abs_ && head_scales_.empty()) {
    hooks_ = nullptr;
    return;
  }
  auto h = std::make_shared<fwd::Hooks>();
  for (const HeadScale& x : head_scales_) h->add(fwd::scale_head_hook(cfg_, x.layer, x.head, x.factor));
  if (watch_max_abs_) h->add(fwd::max_abs_hidden_hook());
  hooks_ = std::move(h);
}

void Session::set_watch_max_abs_hidden(bool on) {
  if (on == watch_max_abs_) return;
  watch_max_abs_ = on;
  if (on) reader_dirty_ = true;  // layers that earlier runs left were not read
  rebuild_hooks();
}

void Session::set_head_scale(int layer, int head, std::optional<float> factor) {
  if (layer < 0 || layer >= cfg_.layers)
    throw Error("layer " + std::to_string(layer) + " does not exist (the model has " + std::to_string(cfg_.layers) +
                " layers)");
  if (!cfg_.has_maps(layer)) throw Error(cfg_.no_attention(layer, "heads to ablate"));
  if (head < 0 || head >= cfg_.view_heads())
    throw Error("head " + std::to_string(head) + " does not exist (layers have " + std::to_string(cfg_.view_heads()) +
                " view heads)");
  if (factor && !std::isfinite(*factor)) throw Error("a head's scale must be a finite number");
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

std::vector<float> Session::next_token_logprobs() const {
  if (!has_result_) return {};
  ensure_logits();
  const int64_t V = cfg_.vocab;
  const float* row = res_.logits.data() + (res_.logit_rows - 1) * V;
  const float mx = *std::max_element(row, row + V);
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(row[i] - mx));
  const float lse = mx + float(std::log(s));
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
  req.append_from = n;
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
