// Exporters. See export.h.
#include "export.h"
#include "engine/core/safe_write.h"

#include <GL/gl.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ds::gui {

std::vector<uint8_t> read_framebuffer(int x, int y, int w, int h, int fb_h) {
  std::vector<uint8_t> px(size_t(w) * h * 4);
  std::vector<uint8_t> row(size_t(w) * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(x, fb_h - y - h, w, h, GL_RGBA, GL_UNSIGNED_BYTE, px.data());
  for (int i = 0; i < h / 2; ++i) {  // GL rows run bottom-up
    uint8_t* a = px.data() + size_t(i) * w * 4;
    uint8_t* b = px.data() + size_t(h - 1 - i) * w * 4;
    std::memcpy(row.data(), a, row.size());
    std::memcpy(a, b, row.size());
    std::memcpy(b, row.data(), row.size());
  }
  for (size_t i = 3; i < px.size(); i += 4)
    px[i] = 255;  // the window is opaque; keep the PNG opaque too
  return px;
}

// Every export goes through the engine's safe writer (a temporary renamed over the target when whole; symlinks,
// non-regular files and write errors handled): false with the one-line reason in err.
static bool write_safely(const std::string& path, const std::string& content, const char* what, std::string* err) {
  try {
    ds::write_file_safely(path, content, what);
    return true;
  } catch (const std::exception& e) {
    if (err)
      *err = e.what();
    return false;
  }
}

bool write_png(const std::string& path, const std::vector<uint8_t>& rgba, int w, int h, std::string* err) {
  if (w <= 0 || h <= 0 || rgba.size() < size_t(w) * h * 4) {
    if (err)
      *err = path + ": nothing to write (empty region)";
    return false;
  }
  std::string png;
  auto append = [](void* ctx, void* data, int size) { static_cast<std::string*>(ctx)->append(static_cast<char*>(data), size_t(size)); };
  if (!stbi_write_png_to_func(append, &png, w, h, 4, rgba.data(), w * 4)) {
    if (err)
      *err = path + ": cannot encode the PNG";
    return false;
  }
  return write_safely(path, png, "the PNG", err);
}

// The NPY format is small enough to write by hand: magic "\x93NUMPY", version 1.0, a little-endian u16 header
// length, then a Python dict literal padded with spaces to a multiple of 64 bytes and ending in '\n', then the
// raw data (numpy's format.py documents it).
bool write_npy(const std::string& path, const float* data, int64_t rows, int64_t cols, std::string* err) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  const size_t prefix = 10;  // magic (6) + version (2) + header length (2)
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header += '\n';
  const uint16_t hl = uint16_t(header.size());
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(hl & 0xff), uint8_t(hl >> 8)};
  std::string out(reinterpret_cast<const char*>(pre), sizeof pre);
  out += header;
  out.append(reinterpret_cast<const char*>(data), size_t(rows * cols) * sizeof(float));  // x86/ARM: LE
  return write_safely(path, out, "the NPY file", err);
}

// The head view's maps as the engine gave them: the visible rectangle's grid (the full map, exactly, when it is
// small enough to be shown one cell per token).
bool export_head_npy(const AppState& st, const std::string& prefix, std::vector<std::string>* files, std::string* err) {
  const auto& hm = st.snap ? st.snap->head : nullptr;
  if (!hm) {
    if (err)
      *err = "no head to export: run a prompt first";
    return false;
  }
  const MapView& v = hm->view;
  const std::pair<const char*, const std::vector<float>*> maps[] = {
      {hm->implicit ? "m" : hm->differential ? "a1" : "a", &v.a1}, {"a2", &v.a2}, {"diff", &v.diff}};
  for (int i = 0; i < (hm->differential ? 3 : 1); ++i) {
    const std::string path = prefix + "_" + maps[i].first + ".npy";
    if (!write_npy(path, maps[i].second->data(), v.rows, v.cols, err))
      return false;
    if (files)
      files->push_back(path);
  }
  return true;
}

static std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (char c : s)
    out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

bool export_head_csv(const AppState& st, const std::string& path, std::string* err) {
  const auto& hm = st.snap ? st.snap->head : nullptr;
  const auto& res = st.snap ? st.snap->result : nullptr;
  if (!hm || !res) {
    if (err)
      *err = "no head to export: run a prompt first";
    return false;
  }
  std::ostringstream f;
  const MapView& v = hm->view;
  const bool exact = hm->exact();
  f << "# layer " << hm->layer << ", head " << hm->head << ", lambda " << hm->lambda << ", queries " << v.q0 << ":"
    << v.q1 << ", keys " << v.k0 << ":" << v.k1 << " of " << hm->n << " tokens";
  if (exact) {
    f << ", one row per causal cell\n";
    f << "query,key,query_token,key_token,a1,a2,diff\n";
  } else {
    f << ", " << v.rows << " x " << v.cols << " cells, " << (v.pool == Pool::Mean ? "mean" : "max")
      << " of each block of tokens [query_start, query_end) x [key_start, key_end)\n";
    f << "query_start,query_end,key_start,key_end,a1,a2,diff\n";
  }
  auto tok = [&](int64_t i) { return csv_field(i < int64_t(res->tokens.size()) ? res->tokens[size_t(i)] : ""); };
  char num[96];
  for (int i = 0; i < v.rows; ++i) {
    const int64_t r0 = hm->row_start(i), r1 = hm->row_start(i + 1);
    for (int j = 0; j < v.cols; ++j) {
      const int64_t c0 = hm->col_start(j), c1 = hm->col_start(j + 1);
      if (c0 > r1 - 1)
        break;  // this block and the rest of the row lie past the diagonal
      const size_t at = size_t(i) * size_t(v.cols) + size_t(j);
      if (hm->differential)
        std::snprintf(num, sizeof num, "%.7g,%.7g,%.7g", v.a1[at], v.a2[at], v.diff[at]);
      else
        std::snprintf(num, sizeof num, "%.7g,,%.7g", v.a1[at], v.a1[at]);
      if (exact)
        f << r0 << ',' << c0 << ',' << tok(r0) << ',' << tok(c0) << ',' << num << '\n';
      else
        f << r0 << ',' << r1 << ',' << c0 << ',' << c1 << ',' << num << '\n';
    }
  }
  return write_safely(path, f.str(), "the CSV", err);
}

static nlohmann::json stats_json(const HeadStats& s) {
  auto num = [](float v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  return {
      {"entropy_a1", num(s.entropy1)},    {"entropy_a2", num(s.entropy2)},   {"entropy_diff", num(s.entropy_diff)},
      {"first_token_a1", num(s.first1)},  {"first_token_a2", num(s.first2)}, {"first_token_diff", num(s.first_diff)},
      {"negative_mass", num(s.neg_mass)}, {"diff_min", num(s.diff_min)},     {"diff_max", num(s.diff_max)},
      {"max_logit1", num(s.max_logit1)},  {"max_logit2", num(s.max_logit2)}};
}

nlohmann::json session_json(const AppState& st) {
  using nlohmann::json;
  json j = {{"tool", "diffscope"}};
  if (!st.snap || !st.snap->model) {
    j["model"] = nullptr;
    return j;
  }
  const ModelInfo& m = *st.snap->model;
  const ModelConfig& c = m.cfg;
  j["model"] = {{"dir", m.dir},
                {"arch", c.family()},
                {"model_type", c.model_type},
                {"layers", c.layers},
                {"heads", c.heads},
                {"kv_heads", c.kv_heads},
                {"view_heads", c.view_heads()},
                {"head_dim", c.head_dim},
                {"hidden", c.hidden},
                {"vocab", c.vocab},
                {"params", c.params()},
                {"tokenizer", m.tokenizer}};
  j["device"] = {{"backend", m.backend_name}, {"kind", m.backend_kind}};
  j["selected"] = {{"layer", st.layer}, {"head", st.head}};
  const auto& rp = st.snap->result;
  if (!rp)
    return j;
  const RunResult& r = *rp;
  // The sequence is the prompt and the tokens generated after it (maps, rows and statistics cover both).
  const size_t n = r.ids.size();
  const size_t P = r.prompt_len > 0 ? std::min(size_t(r.prompt_len), n) : n;
  const std::vector<int32_t> prompt_ids(r.ids.begin(), r.ids.begin() + std::ptrdiff_t(P));
  const std::vector<std::string> prompt_tokens(r.tokens.begin(), r.tokens.begin() + std::ptrdiff_t(std::min(P, r.tokens.size())));
  j["prompt"] = {{"mode", st.req.use_ids ? "ids" : "text"},
                 {"text", st.req.use_ids ? "" : st.req.text},
                 {"ids", prompt_ids},
                 {"tokens", prompt_tokens}};
  j["prompt_tokens"] = P;
  j["generated"] = std::vector<int32_t>(r.ids.begin() + std::ptrdiff_t(P), r.ids.end());
  const auto& gp = st.snap->gen;
  if (m.has_tokenizer)
    j["generated_text"] = gp ? gp->now.text : "";
  j["stop_reason"] = gp ? gp->now.stop_reason : "";
  if (gp) {
    const Generation& g = *gp;
    auto options = [](const GenerateOptions& o) {
      return json{{"max_new", o.max_new},         {"stop_at_eos", o.stop_at_eos},
                  {"temperature", o.sampling.temperature}, {"top_k", o.sampling.top_k},
                  {"top_p", o.sampling.top_p},    {"seed", o.sampling.seed}};
    };
    auto lambda = [](const LambdaControl& c) {
      json ov = json::array();
      for (const auto& o : c.override_)
        ov.push_back(o ? json(*o) : json(nullptr));
      return json{{"scale", c.scale}, {"override", ov}};
    };
    auto continuation = [&](const Continuation& c) {
      return json{{"ids", c.ids},           {"tokens", c.tokens},   {"text", c.text},
                  {"stop_reason", c.stop_reason}, {"options", options(c.options)}, {"lambda", lambda(c.lambda)},
                  {"lambda_moved", c.lambda_moved}};
    };
    j["generation"] = {{"streaming", g.streaming},
                       {"active", g.active},
                       {"tokens_per_s", g.tokens_per_s()},
                       {"step_ms", g.step_ms},
                       {"now", continuation(g.now)},
                       {"before", g.before ? continuation(*g.before) : json(nullptr)},
                       {"first_diff", g.first_diff}};
  }
  json overrides = json::array();
  for (const auto& o : r.control.override_)
    overrides.push_back(o ? json(*o) : json(nullptr));
  j["lambda"] = {
      {"scale", r.control.scale}, {"override", overrides}, {"effective", r.lambda}, {"model", m.model_lambda}};
  json top = json::array();
  for (const auto& t : r.top)
    top.push_back({{"id", t.id}, {"text", t.text}, {"prob", t.prob}, {"logit", t.logit}});
  j["next_token"] = top;
  // The engine's statistics (Backend::head_stats) of the layers the overview has computed for this result.
  json stats = json::array();
  if (const auto& ov = st.snap->overview; ov && ov->result_seq == r.seq)
    for (size_t l = 0; l < ov->layers.size(); ++l)
      for (size_t h = 0; h < ov->layers[l].heads.size(); ++h) {
        json e = stats_json(ov->layers[l].heads[h]);
        e["layer"] = l;
        e["head"] = h;
        stats.push_back(e);
      }
  j["statistics"] = stats;
  const Profile& p = r.profile;
  j["device"]["peak_tflops"] = p.peak_tflops > 0 ? json(p.peak_tflops) : json(nullptr);
  double attn_ms = 0, flops = 0;
  for (const auto& h : p.heads)
    attn_ms += h.ms, flops += h.flops;
  json kernels = json::array();
  for (const auto& k : p.kernels)
    kernels.push_back(
        {{"name", k.name}, {"count", k.count}, {"total_ms", k.total_ms}, {"min_ms", k.min_ms}, {"max_ms", k.max_ms}});
  json heads = json::array();
  for (const auto& h : p.heads)
    heads.push_back({{"layer", h.layer}, {"head", h.head}, {"ms", h.ms}, {"flops", h.flops}});
  json lanes = json::array();  // a layer split's devices (the Profiler's lanes)
  for (const DeviceLane& d : p.lanes)
    lanes.push_back({{"device", d.device},       {"first_layer", d.first_layer}, {"end_layer", d.end_layer},
                     {"start_ms", d.start_ms},   {"end_ms", d.end_ms},           {"handoff_ms", d.handoff_ms},
                     {"kernels_ms", d.kernels_ms}});
  j["timings"] = {{"run_ms", r.run_ms},
                  {"first_layer", r.first_layer},
                  {"forward_ms", p.forward_ms},
                  {"tokens", p.tokens},
                  {"tokens_per_s", p.forward_ms > 0 ? double(r.tokens_run()) / (p.forward_ms * 1e-3) : 0.0},
                  {"generation_step", r.decoded > 0},
                  {"attention_ms", attn_ms},
                  {"attention_tflops", attn_ms > 0 ? flops / (attn_ms * 1e-3) / 1e12 : 0.0},
                  {"kernels", kernels},
                  {"heads", heads},
                  {"lanes", lanes}};
  // The interventions the result on screen ran with, as the engine records them (interventions_json).
  j["interventions"] = r.interventions.empty() ? json::array() : json::parse(r.interventions);
  j["logit_bits"] = r.logit_bits;
  if (const auto& lv = st.snap->lens; lv && lv->result_seq == r.seq)  // the Row panel's logit lens (--lens)
    j["lens"] = json::parse(lens_json(lv->lens));
  if (const auto& ov = st.snap->outliers; ov && ov->result_seq == r.seq)  // the Profiler's outliers (--outliers)
    j["outliers"] = json::parse(outliers_json(ov->o));
  if (const auto& qv = st.snap->quant; qv && qv->result_seq == r.seq)  // the lambda panel's "vs full precision"
    j["quantization"] = json::parse(quantize_report_json(qv->q));
  if (const auto& imp = st.snap->importance)  // the Overview's importance mode (--importance)
    j["importance"] = json::parse(head_importance_json(imp->h));
  if (!r.max_abs_hidden.empty())  // the Table 5 reader (Profiler panel, "max |h|"; --max-abs-hidden)
    j["max_abs_hidden"] = r.max_abs_hidden;
  if (const auto& sw = st.snap->sweep) {
    json pts = json::array();
    for (const auto& pt : sw->points)
      pts.push_back({{"lambda", pt.lambda}, {"logprob", pt.logprob}, {"entropy", pt.entropy}});
    j["sweep"] = {{"layer", sw->layer},           {"head", sw->head},         {"token", sw->token},
                  {"token_text", sw->token_text}, {"complete", sw->complete}, {"points", pts}};
  }
  return j;
}

bool export_session_json(const AppState& st, const std::string& path, std::string* err) {
  return write_safely(path, session_json(st).dump(2) + "\n", "the session", err);
}

}  // namespace ds::gui
