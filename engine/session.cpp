// Session: model + backend + tokenizer + prompt + lambda state. Limits are checked here, before any work.
#include "session.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "error.h"

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
  s->lam_.override_.assign(size_t(s->cfg_.layers), std::nullopt);
  s->ran_lambda_.assign(size_t(s->cfg_.layers), NAN);
  return s;
}

void Session::set_prompt(const std::string& text) {
  if (!tok_) throw Error("cannot tokenize a prompt: " + (tok_error_.empty() ? "no tokenizer" : tok_error_));
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

int Session::run(bool all_logits) {
  if (ids_.empty()) throw Error("no prompt: give a prompt or token ids first");
  const int L = int(cfg_.layers);
  std::vector<float> lam(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) lam[size_t(l)] = float(effective_lambda(l));
  int from = 0;
  const bool want_all = all_logits && (!has_result_ || res_.logit_rows != int64_t(ids_.size()));
  if (!ids_dirty_ && has_result_ && !want_all) {
    from = L;
    for (int l = 0; l < L; ++l)
      if (!(lam[size_t(l)] == ran_lambda_[size_t(l)])) {
        from = l;
        break;
      }
    if (from == L) return L;
  }
  ForwardRequest req;
  req.ids = ids_;
  req.lambda = lam;
  req.from_layer = from;
  req.all_logits = all_logits;
  backend_->forward(req, res_);
  has_result_ = true;
  ids_dirty_ = false;
  ran_lambda_ = lam;
  // Maps of layer l depend only on layers < l: those up to `from` stay valid.
  maps_cache_.resize(size_t(L));
  for (int l = from + 1; l < L; ++l) maps_cache_[size_t(l)] = LayerMaps{};
  if (from == 0) maps_cache_[0] = LayerMaps{};
  return from;
}

const LayerMaps& Session::maps(int layer) {
  if (!has_result_) throw Error("no result yet: run the model first");
  if (layer < 0 || layer >= cfg_.layers) throw Error("layer " + std::to_string(layer) + " does not exist");
  if (!cfg_.has_maps(layer)) throw Error(cfg_.no_attention(layer, "attention maps"));
  LayerMaps& m = maps_cache_[size_t(layer)];
  if (m.empty()) backend_->layer_maps(layer, m);
  return m;
}

std::vector<float> Session::next_token_logprobs() const {
  if (!has_result_) return {};
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

}  // namespace ds
