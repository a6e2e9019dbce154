// diffscope-run: run a prompt through a checkpoint of a family in engine/core/arch.h, print the next-token candidates,
// optionally dump logits, maps and lambdas to a safetensors file. Also a scripted tokenizer (--tokenize-jsonl).
//
// Exit codes: 0 ok, 2 bad arguments, 3 unusable model or input file (one line on stderr each).
#include <cmath>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "app/cli/run_args.h"
#include "engine/session/session.h"
#include "engine/session/session_importance.h"
#include "engine/session/session_lens.h"
#include "engine/session/session_outliers.h"
#include "engine/session/session_quantize.h"
#include "engine/session/session_sweep.h"
#include "engine/core/input_limits.h"
#include "engine/core/safe_write.h"

namespace {

constexpr int kExitArgs = 2, kExitInput = 3, kExitInterrupted = 130;

using ds::cli::Args;
using ds::cli::ArgError;

int tokenize_jsonl(const Args& a) {
  std::unique_ptr<ds::Tokenizer> tok;
  if (!a.tokenizer.empty()) {
    tok = ds::load_tokenizer(a.tokenizer);
  } else {
    tok = ds::find_tokenizer(a.model);
    if (!tok) throw ds::Error(a.model + ": no tokenizer.json or tokenizer.model in this folder");
  }
  std::ifstream in(a.tokenize_jsonl);
  if (!in) ds::fail_file(a.tokenize_jsonl, "cannot open");
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = ds::parse_json(line, a.tokenize_jsonl + ": line " + std::to_string(lineno));
    } catch (const nlohmann::json::exception&) {
      ds::fail_file(a.tokenize_jsonl, "line " + std::to_string(lineno) + " is not valid JSON");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      ds::fail_file(a.tokenize_jsonl, "line " + std::to_string(lineno) + " has no string field \"text\"");
    const std::vector<int32_t> ids = tok->encode(j["text"].get<std::string>(), a.add_special);
    nlohmann::json o{{"ids", ids}};
    if (a.decode) o["decoded"] = tok->decode(ids);
    std::cout << o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  return 0;
}


// --dump: logits, and either every layer's full maps (O(n^2): small prompts) or, with --rows / --view, the rows
// and the view only (O(n heads + R C)).
void dump(ds::Session& s, const Args& a) {
  const std::string& path = a.dump;
  const ds::ModelConfig& c = s.config();
  const ds::ForwardResult& r = s.result();
  std::vector<ds::TensorOut> out;
  std::vector<int32_t> ids = s.ids();
  out.push_back({"input_ids", ds::DType::I32, {int64_t(ids.size())}, ids.data()});
  out.push_back({"logits", ds::DType::F32, {r.logit_rows, c.vocab}, r.logits.data()});
  std::vector<float> lambdas(static_cast<size_t>(c.layers));
  for (int l = 0; l < c.layers; ++l) lambdas[size_t(l)] = float(s.effective_lambda(l));
  // Each head's lambda (its own, set by --head-lambda or 0 by --ablate L.H:a2, else the layer's): the one its
  // difference map (view.diff, the GUI's) takes.
  const int64_t H = c.view_heads();
  std::vector<float> head_lambdas(size_t(c.layers) * size_t(H));
  for (int l = 0; l < c.layers && c.is_diff(); ++l)
    for (int h = 0; h < H; ++h) head_lambdas[size_t(l) * size_t(H) + size_t(h)] = float(s.head_lambda(l, h));
  auto add_lambdas = [&](int l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "lambda", ds::DType::F32, {1}, &lambdas[size_t(l)]});
    out.push_back({p + "head_lambda", ds::DType::F32, {H}, &head_lambdas[size_t(l) * size_t(H)]});
  };
  const bool queries = a.view || !a.rows.empty();
  // Only layers with attention have maps and a lambda (SambaY's Mamba and GMU layers are absent from the dump).
  const std::vector<int64_t> map_layers = c.map_layers();
  std::vector<ds::MapRows> rows(queries && !a.rows.empty() ? map_layers.size() : 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t l = map_layers[i];
    s.backend().map_rows(int(l), a.rows, rows[i]);
    const ds::MapRows& m = rows[i];
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::vector<int64_t> shape{m.heads, int64_t(m.positions.size()), m.n};
    out.push_back({p + "rows1", ds::DType::F32, shape, m.a1.data()});
    if (c.is_diff()) out.push_back({p + "rows2", ds::DType::F32, shape, m.a2.data()});
  }
  std::vector<int64_t> positions = rows.empty() ? std::vector<int64_t>{} : rows[0].positions;
  if (!positions.empty()) out.push_back({"rows.positions", ds::DType::I64, {int64_t(positions.size())}, positions.data()});
  ds::MapView view;
  if (a.view) {
    ds::ViewRequest q;
    q.layer = a.view->layer, q.head = a.view->head;
    q.q0 = a.view->q0, q.q1 = a.view->q1, q.k0 = a.view->k0, q.k1 = a.view->k1;
    q.rows = a.view->rows, q.cols = a.view->cols;
    q.pool = a.view->mean ? ds::Pool::Mean : ds::Pool::Max;
    s.backend().map_view(q, view);
    const std::vector<int64_t> shape{view.rows, view.cols};
    out.push_back({"view.a1", ds::DType::F32, shape, view.a1.data()});
    if (view.differential) out.push_back({"view.a2", ds::DType::F32, shape, view.a2.data()});
    out.push_back({"view.diff", ds::DType::F32, shape, view.diff.data()});
  }
  std::vector<int64_t> view_rect{view.q0, view.q1, view.k0, view.k1};
  if (a.view) out.push_back({"view.rect", ds::DType::I64, {4}, view_rect.data()});
  for (int64_t l64 : map_layers) {
    const int l = int(l64);
    if (queries) {
      if (c.is_diff()) add_lambdas(l);
      continue;
    }
    const ds::LayerMaps& m = s.maps(l);
    const std::string p = "layers." + std::to_string(l) + ".";
    if (c.is_diff()) {
      out.push_back({p + "attn1", ds::DType::F32, {m.heads, m.n, m.n}, m.a1.data()});
      out.push_back({p + "attn2", ds::DType::F32, {m.heads, m.n, m.n}, m.a2.data()});
      add_lambdas(l);
    } else {
      out.push_back({p + "attn", ds::DType::F32, {m.heads, m.n, m.n}, m.a1.data()});
    }
  }
  ds::write_safetensors(path, out, {{"producer", "diffscope-run"}, {"model", s.model_dir()},
                                    {"backend", s.backend().name()},
                                    {"interventions", ds::interventions_json(s)},
                                    {"logit_bits", std::to_string(s.logit_bits())}});
}

// --rows, --view and --rect against the model and the prompt, before the forward (which can take minutes on a long
// prompt). With --generate the sequence grows: positions past the prompt are checked against its longest length.
void check_queries(ds::Session& s, const Args& a) {
  const ds::ModelConfig& c = s.config();
  const int64_t n = int64_t(s.ids().size()), n_max = std::min<int64_t>(n + a.generate, c.max_positions);
  try {
    if (!a.rows.empty()) ds::resolve_positions(a.rows, a.generate > 0 ? n_max : n);
    if (a.view) {  // prepare_view checks the layer, head and rectangle as the backends will
      ds::ViewRequest q;
      q.layer = a.view->layer, q.head = a.view->head;
      q.q0 = a.view->q0, q.q1 = a.view->q1, q.k0 = a.view->k0, q.k1 = a.view->k1;
      q.rows = a.view->rows, q.cols = a.view->cols;
      ds::MapView probe;
      ds::prepare_view(q, int(c.layers), int(c.view_heads()), a.generate > 0 ? n_max : n, c.is_diff(), 0.f, probe,
                       /*zero=*/false);
      if (!c.has_maps(q.layer)) throw ArgError("--view: " + c.no_attention(q.layer, "attention maps"));
    }
  } catch (const ds::Error& e) {
    throw ArgError(std::string(a.view ? "--view/--rect/--rows: " : "--rows: ") + e.what());
  }
}

// A --dump of the full maps holds every attention layer's n x n maps, in memory and then on disk: sized before any
// work against the memory and the disk there are, pointing to --rows / --view, which stay O(n).
void check_full_dump_size(ds::Session& s, const Args& a) {
  const ds::ModelConfig& c = s.config();
  const double n = double(std::min<int64_t>(int64_t(s.ids().size()) + a.generate, c.max_positions));
  const double maps = double(c.map_layers().size()) * double(c.view_heads()) * (c.is_diff() ? 2.0 : 1.0) * n * n * 4.0;
  const double bytes = maps + n * double(c.vocab) * 4.0;
  const double mem = double(ds::available_memory_bytes()), disk = double(ds::free_disk_bytes(a.dump));
  auto gb = [](double b) { return ds::format_bytes(uint64_t(b)); };
  if ((mem > 0 && bytes > 0.8 * mem) || (disk > 0 && bytes > disk))
    throw ArgError("--dump of the full maps of " + std::to_string(int64_t(n)) + " tokens needs " + gb(bytes) +
                   " of memory and of disk, and " + gb(mem) + " of memory and " + gb(disk) + " of disk are free: " +
                   "ask --rows and/or --view instead (the dump then holds those alone)");
}

// --stats FILE.json: every attention layer's per-head statistics (engine/core/map_query.h has the definitions), and every
// layer's largest |hidden state| over the sequence (the paper's Table 5; forward.h max_abs_hidden_hook).
void write_stats(ds::Session& s, const std::string& path) {
  const ds::ModelConfig& c = s.config();
  const std::vector<float> max_abs = s.max_abs_hidden();
  nlohmann::json layers = nlohmann::json::array();
  for (int64_t l64 : c.map_layers()) {  // layers with attention
    const int l = int(l64);
    const std::vector<ds::HeadStats> st = s.backend().head_stats(l);
    nlohmann::json heads = nlohmann::json::array();
    for (size_t h = 0; h < st.size(); ++h) {
      const ds::HeadStats& x = st[h];
      nlohmann::json o{{"head", h},          {"entropy1", x.entropy1},     {"first1", x.first1},
                       {"max_logit1", x.max_logit1}, {"entropy_diff", x.entropy_diff}, {"first_diff", x.first_diff},
                       {"neg_mass", x.neg_mass}, {"diff_min", x.diff_min}, {"diff_max", x.diff_max}};
      if (c.is_diff()) o.update({{"entropy2", x.entropy2}, {"first2", x.first2}, {"max_logit2", x.max_logit2}});
      heads.push_back(o);
    }
    layers.push_back({{"layer", l}, {"kind", ds::layer_kind_name(c.kind(l))},
                      {"lambda", c.is_diff() ? s.effective_lambda(l) : 0.0},
                      {"max_abs_hidden", max_abs.at(size_t(l))}, {"heads", heads}});
  }
  nlohmann::json j{{"model", s.model_dir()}, {"backend", s.backend().name()}, {"tokens", s.ids().size()},
                   {"differential", c.is_diff()}, {"layers", layers},
                   {"max_abs_hidden", max_abs}};  // every layer, attention or not
  ds::write_file_safely(path, j.dump(1) + "\n", "the statistics");
}

std::atomic<bool> g_interrupted{false};
void on_sigint(int) {
  if (g_interrupted.exchange(true)) std::_Exit(kExitInterrupted);  // a second Ctrl-C: at once
}

int run(const Args& a) {
  if (!a.tokenize_jsonl.empty()) return tokenize_jsonl(a);
  // Outputs that cannot be written, or would overwrite an input (the prompt's files, a file of the model's folder),
  // are refused before any work.
  ds::protect_input_folder(a.model);
  const std::vector<std::string> inputs{a.prompt_file, a.token_ids_file};
  if (!a.dump.empty()) ds::check_writable_target(a.dump, "the dump", inputs);
  if (!a.stats.empty()) ds::check_writable_target(a.stats, "the statistics", inputs);
  if (!a.dump.empty() && a.dump == a.stats) throw ArgError("--dump and --stats name the same file " + a.dump);
  if (!a.outliers.empty()) {
    ds::check_writable_target(a.outliers, "the outlier statistics", inputs);
    for (const std::string* o : {&a.dump, &a.stats, &a.importance, &a.lens})
      if (a.outliers == *o) throw ArgError("--outliers names the same file as another output: " + a.outliers);
  }
  if (!a.lens.empty()) {
    ds::check_writable_target(a.lens, "the logit lens", inputs);
    if (a.lens == a.dump || a.lens == a.stats || a.lens == a.importance)
      throw ArgError("--lens names the same file as --dump, --stats or --importance: " + a.lens);
  }
  if (!a.importance.empty()) {
    ds::check_writable_target(a.importance, "the head importance", inputs);
    if (a.importance == a.dump || a.importance == a.stats)
      throw ArgError("--importance names the same file as --dump or --stats: " + a.importance);
  }
  // Read the prompt file before loading the model: a bad file is reported at once.
  std::string prompt = a.prompt;
  std::optional<std::vector<int32_t>> ids = a.ids;
  if (!a.prompt_file.empty()) prompt = ds::read_prompt_file(a.prompt_file);
  if (!a.token_ids_file.empty()) {
    try {
      ids = ds::cli::parse_id_list(ds::read_token_ids_file(a.token_ids_file), a.token_ids_file);
    } catch (const ArgError& e) {
      throw ds::Error(e.what());  // a bad file is bad input (exit 3), not a bad argument
    }
  }
  const std::vector<ds::BackendChoice> backends = ds::parse_backend_list(a.backend);
  // Several devices or a memory limit: the layers are placed for this prompt's length and what will be generated
  // (the tokenizer alone counts a text prompt's tokens before the weights load).
  int64_t plan_tokens = 0;
  if (backends.size() > 1 || a.gpu_mem_limit > 0) {
    const int64_t n = a.have_prompt ? ds::count_tokens_before_load(a.model, prompt) : ids ? int64_t(ids->size()) : 0;
    plan_tokens = n + a.generate;
  }
  auto s = ds::Session::open(a.model, backends, nullptr, a.threads, a.gpu_mem_limit, plan_tokens);
  if (s->backend().devices_used() > 1) std::fprintf(stderr, "diffscope-run: %s\n", s->backend().name().c_str());
  if (a.have_prompt) s->set_prompt(prompt);
  else s->set_ids(*ids);
  const ds::ModelConfig& c = s->config();
  if (!c.is_diff() && (!a.lambdas.empty() || a.lambda_scale))
    throw ArgError("--lambda and --lambda-scale apply to differential models; " + a.model + " is a " + c.family() +
                   " model");
  if (a.lambda_scale) s->set_lambda_scale(*a.lambda_scale);
  for (auto [l, v] : a.lambdas) {
    if (l >= c.layers)
      throw ArgError("--lambda: layer " + std::to_string(l) + " does not exist (the model has " +
                     std::to_string(c.layers) + " layers)");
    if (!c.has_maps(l)) throw ArgError("--lambda: " + c.no_attention(l, "lambda"));
    s->set_lambda_override(l, v);
  }
  for (const auto& x : a.interventions) {  // checked against the model: a bad layer, head or span is a usage error
    using K = Args::InterventionArg;
    const std::string what = x.kind == K::Knockout ? "--knockout " + x.knockout
                             : std::string(x.kind == K::Ablate ? "--ablate " : x.kind == K::Scale ? "--scale-head "
                                                                                                  : "--head-lambda ") +
                                   std::to_string(x.layer) + "." + std::to_string(x.head);
    try {
      if (x.kind == K::Ablate) s->ablate(x.layer, x.head, x.mode);
      else if (x.kind == K::Scale) s->set_head_scale(x.layer, x.head, x.value);
      else if (x.kind == K::HeadLambda) s->set_head_lambda(x.layer, x.head, x.value);
      else {
        const ds::Knockout k = ds::parse_knockout(x.knockout, int(c.layers));
        s->add_knockout(k);
        // Causal attention: a query sees no key after it, so a span of keys after every query changes nothing.
        const ds::fwd::KeySpan r = s->resolve_knockout(k, int64_t(s->ids().size()));
        if (r.k0 >= r.q1)
          std::fprintf(stderr, "diffscope-run: note: --knockout %s changes nothing: keys [%lld, %lld) come after every "
                       "query of [%lld, %lld), which cannot see them\n", x.knockout.c_str(), (long long)r.k0,
                       (long long)std::min<int64_t>(r.k1, int64_t(s->ids().size())), (long long)r.q0, (long long)r.q1);
      }
    } catch (const ds::Error& e) {
      const std::string m = e.what();  // parse_knockout's messages name the spec already ("knockout SPEC: ...")
      throw ArgError(m.rfind("knockout " + x.knockout + ":", 0) == 0 ? "--" + m : what + ": " + m);
    }
  }
  if (a.quantize_bits) s->set_logit_bits(a.quantize_bits);
  check_queries(*s, a);  // before any work: a bad --rows, --view or --rect is a usage error (exit 2)
  std::optional<ds::LambdaSweepRequest> sweep;
  if (a.sweep) {  // the same: a sweep the model cannot do is refused before the forward
    sweep = ds::LambdaSweepRequest{a.sweep->layer, a.sweep->from, a.sweep->to, a.sweep->steps, a.sweep->head, -1};
    try {
      ds::check_lambda_sweep(*s, *sweep);
    } catch (const ds::Error& e) {
      throw ArgError(std::string("--sweep: ") + e.what());
    }
  }
  const bool full_maps = !a.dump.empty() && !a.view && a.rows.empty();
  if (full_maps) check_full_dump_size(*s, a);
  if (!a.stats.empty()) s->set_watch_max_abs_hidden(true);  // the Table 5 reader: "max_abs_hidden" per layer
  s->run(full_maps && a.generate == 0);
  if (const std::string bad = s->nonfinite_logits(); !bad.empty()) throw ds::Error(bad);
  const double prefill_ms = s->result().ms;
  if (!a.json) {
    const size_t with_maps = c.map_layers().size();
    const std::string attn_layers =
        with_maps == size_t(c.layers) ? "" : ", " + std::to_string(with_maps) + " with attention";
    std::printf("model   %s (%s, %lld layers%s, %lld %s heads)\nbackend %s\ntokens  %zu   forward %.2f ms\n",
                a.model.c_str(), c.family(), (long long)c.layers, attn_layers.c_str(), (long long)c.view_heads(),
                c.is_diff() ? "differential" : "attention", s->backend().name().c_str(), s->ids().size(),
                prefill_ms);
    if (!s->tokenizer_error().empty() && a.have_prompt) std::printf("note    %s\n", s->tokenizer_error().c_str());
    for (const std::string& line : ds::intervention_lines(*s)) std::printf("edit    %s\n", line.c_str());
  }
  double gen_ms = 0;
  if (a.generate > 0) {
    ds::GenerateOptions g;
    g.max_new = a.generate;
    g.stop_at_eos = !a.ignore_eos;
    g.sampling = {a.temperature, a.sample_top_k, a.top_p, a.seed};
    // Text output streams the continuation as it comes (whole UTF-8 characters only).
    size_t shown = 0;
    if (!a.json) std::printf("\n%s", s->tokenizer() ? "generated: " : "generated ids:");
    const auto t0 = std::chrono::steady_clock::now();
    // Ctrl-C stops between tokens: what was generated is kept, printed and reported (exit 130).
    g_interrupted = false;
    std::signal(SIGINT, on_sigint);
    s->generate(g, [&](int32_t id) {
      if (g_interrupted) return false;
      if (a.json) return true;
      if (!s->tokenizer()) {
        std::printf(" %d", id);
      } else {
        const std::string text = s->generated_text();
        if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return true;  // partial character
        if (text.size() > shown) std::fwrite(text.data() + shown, 1, text.size() - shown, stdout);
        shown = text.size();
      }
      std::fflush(stdout);
      return true;
    });
    std::signal(SIGINT, SIG_DFL);
    gen_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!a.json) {
      const std::string text = s->tokenizer() ? s->generated_text() : "";
      if (text.size() > shown) std::fwrite(text.data() + shown, 1, text.size() - shown, stdout);
      const size_t k = s->generated().size();
      std::printf("\n        %zu tokens in %.1f ms (%.1f tokens/s), stop: %s\n", k, gen_ms,
                  gen_ms > 0 ? 1e3 * double(k) / gen_ms : 0.0, ds::stop_reason_name(s->stop_reason()));
    }
    if (full_maps && !a.quantize_bits) s->run(true);  // every position's logits, for --dump (or after the report)
  }
  // --quantize-logits: at the sequence's last position (after the generated tokens, as the top tokens below):
  // full precision against the quantised run, which then runs again
  std::optional<ds::QuantizeReport> quant;
  if (a.quantize_bits) {
    quant = ds::quantize_report(*s, a.quantize_bits);
    s->run(full_maps);
    if (!a.json)
      std::printf("quant   attention logits at %d bits, position %lld: KL from full precision %.3g nats, max "
                  "|change of %s| %.3g over its attention rows, top-1 %d (full precision %d)\n", quant->bits, (long long)quant->position, quant->kl,
                  c.is_diff() ? "A1 - lambda A2" : "A1", quant->max_diff_change, quant->top_quantised,
                  quant->top_full);
  }
  const auto top = s->top_k(a.top_k);
  std::optional<ds::LambdaSweep> sw;
  if (sweep) sw = ds::run_lambda_sweep(*s, *sweep);
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["backend"] = s->backend().name();
    j["tokens"] = s->ids().size();
    j["forward_ms"] = prefill_ms;
    if (a.generate > 0) {
      j["prompt_tokens"] = s->prompt_length();
      j["generated"] = s->generated();
      if (s->tokenizer()) j["text"] = s->generated_text();
      j["stop_reason"] = ds::stop_reason_name(s->stop_reason());
      j["generate_ms"] = gen_ms;
    }
    nlohmann::json tk = nlohmann::json::array();
    for (const auto& t : top) tk.push_back({{"id", t.id}, {"prob", t.prob}, {"logit", t.logit}, {"text", t.text}});
    j["top_k"] = tk;
    j["interventions"] = nlohmann::json::parse(ds::interventions_json(*s));  // the interventions in force
    if (quant) j["quantization"] = nlohmann::json::parse(ds::quantize_report_json(*quant));
    if (c.is_diff()) {  // [L]: 0 for layers without attention
      std::vector<double> lam;
      for (int l = 0; l < c.layers; ++l) lam.push_back(s->effective_lambda(l));
      j["lambda"] = lam;
    }
    if (sw) {
      nlohmann::json pts = nlohmann::json::array();
      for (const ds::LambdaSweepPoint& p : sw->points)
        pts.push_back({{"lambda", p.lambda}, {"logprob", p.logprob}, {"entropy_diff", p.entropy}});
      std::vector<int> heads;
      for (int h = sw->head < 0 ? 0 : sw->head; h < (sw->head < 0 ? int(c.view_heads()) : sw->head + 1); ++h)
        heads.push_back(h);
      j["sweep"] = {{"layer", sw->layer}, {"lambda", sw->current_lambda}, {"token", sw->token},
                    {"token_text", sw->token_text}, {"heads", heads}, {"points", pts}};
    }
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  } else {
    if (!top.empty()) std::printf("\n  rank       id      prob     logit  token\n");
    for (size_t i = 0; i < top.size(); ++i)
      std::printf("  %4zu %8d  %8.5f  %8.3f  %s\n", i + 1, top[i].id, top[i].prob, top[i].logit,
                  nlohmann::json(top[i].text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    if (sw) {
      std::printf("\nlambda sweep of layer %d (lambda %.4f): log p(%s) and the difference entropy%s\n", sw->layer,
                  sw->current_lambda,
                  nlohmann::json(sw->token_text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(),
                  sw->head < 0 ? " (mean over heads)" : (" of head " + std::to_string(sw->head)).c_str());
      std::printf("  %10s %12s %12s\n", "lambda", "log p", "entropy");
      for (const ds::LambdaSweepPoint& p : sw->points) {
        double e = 0;
        for (double x : p.entropy) e += x;
        std::printf("  %10.4f %12.5f %12.5f\n", p.lambda, p.logprob, e / double(std::max<size_t>(1, p.entropy.size())));
      }
    }
  }
  bool outliers_interrupted = false;
  if (!a.outliers.empty()) {
    g_interrupted = false;
    std::signal(SIGINT, on_sigint);
    ds::OutlierRequest q;  // Ctrl-C stops the logits' passes between layers: nothing is written, the rest goes on
    q.cancel = [] { return g_interrupted.load(); };
    // Long work (every layer's attention logits, twice): said on stderr, with the fraction done on a terminal
    const bool tty = isatty(fileno(stderr));
    std::fprintf(stderr, "diffscope-run: the activation outliers: every layer's attention logits, pass by pass "
                         "(Ctrl-C stops them)\n");
    if (tty) q.progress = [](double f) { std::fprintf(stderr, "\r  %3.0f %%", 100 * f); };
    std::optional<ds::Outliers> got;
    try {
      got = ds::outlier_stats(*s, q);
      if (tty) std::fprintf(stderr, "\n");
    } catch (const ds::Cancelled&) {
      if (tty) std::fprintf(stderr, "\n");
      outliers_interrupted = true;
      std::fprintf(stderr, "diffscope-run: interrupted: the outlier statistics were not written (%s)\n",
                   a.outliers.c_str());
    }
    std::signal(SIGINT, SIG_DFL);
    if (got) {
      const ds::Outliers& o = *got;
      ds::write_file_safely(a.outliers, ds::outliers_json(o) + "\n", "the outlier statistics");
      if (!a.json) {
        std::printf("\nactivation outliers (top 1 / median):  hidden %.4g / %.4g", double(o.hidden.s.top[0]),
                    double(o.hidden.s.median));
        if (o.logit1.s.count)
          std::printf("   logit1 %.4g / %.4g", double(o.logit1.s.top[0]), double(o.logit1.s.median));
        if (o.logit2.s.count)
          std::printf("   logit2 %.4g / %.4g", double(o.logit2.s.top[0]), double(o.logit2.s.median));
        std::printf("\nwrote %s\n", a.outliers.c_str());
      }
    }
  }
  if (!a.lens.empty()) {
    const auto quote = [](const std::string& t) {  // a token's text, JSON-quoted (control bytes escaped)
      return nlohmann::json(t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    ds::LensRequest q;
    if (!a.lens_positions.empty()) q.positions = a.lens_positions;
    q.top_k = a.lens_top_k;
    q.target = a.lens_target;
    try {
      ds::check_lens(*s, q);
    } catch (const ds::Error& e) {
      throw ArgError(std::string("--lens: ") + e.what());
    }
    const auto t_lens = std::chrono::steady_clock::now();
    const ds::Lens lens = ds::logit_lens(*s, q);
    const double lens_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_lens).count();
    std::fprintf(stderr, "diffscope-run: logit lens of %zu layers x %zu positions in %.2f ms after the forward\n",
                 lens.layers.size(), lens.layers.empty() ? size_t(0) : lens.layers[0].positions.size(), lens_ms);
    ds::write_file_safely(a.lens, ds::lens_json(lens) + "\n", "the logit lens");
    if (!a.json) {
      std::printf("\nlogit lens (target %d %s):\n", lens.target, quote(lens.target_text).c_str());
      for (const ds::LensLayer& l : lens.layers) {
        const ds::LensEntry& e = l.positions.back();
        std::printf("  layer %2d  pos %lld  top %-16s %.4f   target p %.4f rank %lld\n", l.layer, (long long)e.position,
                    quote(e.top.at(0).text).c_str(), double(e.top.at(0).prob), double(e.target_prob),
                    (long long)e.target_rank);
      }
      std::printf("wrote %s\n", a.lens.c_str());
    }
  }
  if (!a.importance.empty()) {
    ds::HeadImportanceRequest q;
    q.target = a.importance_target;
    q.modes = a.importance_modes.empty() ? ds::importance_modes(c) : a.importance_modes;
    try {
      ds::check_head_importance(*s, q);
    } catch (const ds::Error& e) {
      throw ArgError(std::string("--importance: ") + e.what());
    }
    g_interrupted = false;
    std::signal(SIGINT, on_sigint);
    ds::HeadImportanceHooks hooks;  // Ctrl-C: the heads measured so far are written ("complete": false)
    hooks.stop = [] { return g_interrupted.load(); };
    hooks.cancel = hooks.stop;
    const ds::HeadImportance h = ds::run_head_importance(*s, q, hooks);
    std::signal(SIGINT, SIG_DFL);
    ds::write_file_safely(a.importance, ds::head_importance_json(h) + "\n", "the head importance");
    if (!a.json)
      std::printf("\nwrote %s (%lld of %lld ablations, target %d)\n", a.importance.c_str(), (long long)h.done,
                  (long long)h.total, h.target);
  }
  if (!a.stats.empty()) {
    write_stats(*s, a.stats);
    if (!a.json) std::printf("\nwrote %s\n", a.stats.c_str());
  }
  if (!a.dump.empty()) {
    dump(*s, a);
    if (!a.json) std::printf("\nwrote %s\n", a.dump.c_str());
  }
  return g_interrupted || outliers_interrupted ? kExitInterrupted : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = ds::cli::parse_args(argc, argv);
    if (a.help) {
      std::fputs(ds::cli::kUsage, stdout);
      return 0;
    }
    return run(a);
  } catch (const ArgError& e) {
    std::fprintf(stderr, "diffscope-run: %s\n", e.what());
    return kExitArgs;
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "diffscope-run: %s\n", e.what());
    return kExitInput;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "diffscope-run: out of memory (try a shorter prompt or the other backend)\n");
    return kExitInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diffscope-run: %s\n", e.what());
    return kExitInput;
  }
}
