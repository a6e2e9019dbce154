// The forward pass written once (forward.h): the blocks of every layer kind as sequences of operations.
#include "engine/core/forward.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"

namespace ds::fwd {

const char* gemm_name(Weight w) {
  static const char* const names[] = {"gemm_qkv",     "gemm_q",      "gemm_o",       "gemm_gate_up",  "gemm_down",
                                      "gemm_in_proj", "gemm_x_proj", "gemm_dt_proj", "gemm_out_proj", "gemm_lm_head"};
  return names[int(w)];
}

bool Hooks::needs_all_rows() const {
  for (const Hook& h : hooks_)
    if (h.all_rows) return true;
  return false;
}

void Hooks::call(HookPoint at, int layer, Ref tensor, Ops& ops) const {
  for (const Hook& h : hooks_)
    if (h.at == at && (h.layer < 0 || h.layer == layer)) h.fn(ops, HookSite{at, layer, tensor});
}

Hook max_abs_hidden_hook() {
  return Hook{HookPoint::BlockOut, -1, [](Ops& ops, const HookSite& s) { ops.max_abs(s.tensor, s.layer); }, true};
}

std::pair<int64_t, int64_t> head_columns(const ModelConfig& cfg, int head) {
  const int64_t width = cfg.heads * cfg.head_dim / cfg.view_heads();  // Attn holds the view heads side by side
  return {head * width, (head + 1) * width};
}

namespace {
// A head writer's site: an attention layer's view head.
void check_head_site(const ModelConfig& cfg, int layer, int head, const char* what) {
  if (layer < 0 || layer >= cfg.layers || !cfg.has_maps(layer))
    throw Error(std::string(what) + ": layer " + std::to_string(layer) + " has no attention");
  if (head < 0 || head >= cfg.view_heads()) throw Error(std::string(what) + ": head " + std::to_string(head));
}
}  // namespace

Hook scale_head_hook(const ModelConfig& cfg, int layer, int head, float factor) {
  check_head_site(cfg, layer, head, "scale_head_hook");
  const std::pair<int64_t, int64_t> cols = head_columns(cfg, head);
  const int64_t c0 = cols.first, c1 = cols.second;  // (clang 14 captures no structured binding)
  return Hook{HookPoint::HeadOut, layer,
              [c0, c1, factor](Ops& ops, const HookSite& s) { ops.scale_columns(s.tensor, c0, c1, factor); }, false};
}

std::vector<float> head_coefs(const AttnEdit* edit, float lambda, int view_heads) {
  if (!edit || (edit->a1.empty() && edit->lambda.empty())) return {};
  std::vector<float> c(size_t(2 * view_heads));
  for (int j = 0; j < view_heads; ++j) {
    c[size_t(2 * j)] = edit->a1.empty() ? 1.f : edit->a1.at(size_t(j));
    const float lj = edit->lambda.empty() ? NAN : edit->lambda.at(size_t(j));
    c[size_t(2 * j + 1)] = std::isnan(lj) ? lambda : lj;
  }
  return c;
}

Hook mean_head_hook(const ModelConfig& cfg, int layer, int head, int slot) {
  check_head_site(cfg, layer, head, "mean_head_hook");
  const std::pair<int64_t, int64_t> cols = head_columns(cfg, head);
  const int64_t c0 = cols.first, c1 = cols.second;
  return Hook{HookPoint::HeadOut, layer,
              [c0, c1, slot](Ops& ops, const HookSite& s) { ops.mean_columns(s.tensor, c0, c1, slot); }, true};
}

namespace {

// One hook point: nothing but a test of an empty vector when no hook is registered.
inline void at(const Hooks* hooks, HookPoint p, int layer, Ref t, Ops& ops) {
  if (hooks && !hooks->empty()) hooks->call(p, layer, t, ops);
}

// Self-attention (full, sliding window or cross-layer): pre-norm, projections (a cross-attention layer projects its
// queries only and reads its KV source's keys and values), RoPE, attention, o_proj with the residual add.
void attention_block(const ModelConfig& cfg, Ops& ops, int l, float lambda, Rows rows, const Hooks* hooks,
                     const AttnEdit* edit) {
  edit = edit && !edit->empty() ? edit : nullptr;
  if (!ops.attention_kept(l, lambda, edit)) {
    ops.norm(l, Norm::Input, {Act::Stream, l}, {Act::Normed, l});
    const bool cross = cfg.kind(l) == LayerKind::CrossAttention;
    ops.linear({l, cross ? Weight::Q : Weight::Qkv, {Act::Normed, l}, {Act::Qkv, l}});
    ops.rope(l);
    ops.attention(l, lambda, rows, edit);
    ops.keep_attention(l, lambda, rows, edit);
  }
  at(hooks, HookPoint::HeadOut, l, {Act::Attn, l, rows}, ops);
  ops.linear({l, Weight::O, {Act::Attn, l, rows}, {Act::Stream, l + 1, rows}, Epilogue::Residual, {Act::Stream, l, rows}});
}

// Mamba-1 (docs/models/phi4flash.md section 4): [x | z] = in_proj(norm(h)); u = silu(conv(x)); [dt_raw | B | C] =
// x_proj(u); dt = dt_proj(dt_raw); y = scan(u, dt, B, C) + D u, gated by silu(z); h += out_proj(y). Every row runs
// (the scan runs along the sequence); the memory layer also keeps the ungated y.
void mamba_block(const ModelConfig& cfg, Ops& ops, int l) {
  mamba_inputs(cfg, ops, l);
  ops.scan(l, cfg.kind(l) == LayerKind::Memory);
  ops.linear({l, Weight::OutProj, {Act::Mixed, l}, {Act::Stream, l + 1}, Epilogue::Residual, {Act::Stream, l}});
}

// Gated memory unit (section 5): h += out_proj(silu(in_proj(norm(h))) * memory).
void gmu_block(Ops& ops, int l) {
  ops.norm(l, Norm::Input, {Act::Stream, l}, {Act::Normed, l});
  ops.linear({l, Weight::InProj, {Act::Normed, l}, {Act::Mixed, l}, Epilogue::SiluMemory});
  ops.linear({l, Weight::OutProj, {Act::Mixed, l}, {Act::Stream, l + 1}, Epilogue::Residual, {Act::Stream, l}});
}

// The MLP: h += down(act(gate(norm(h))) * up(norm(h))), in place on Stream(l + 1).
void mlp_block(Ops& ops, int l, Rows rows) {
  const Ref h{Act::Stream, l + 1, rows};
  ops.norm(l, Norm::PostMixer, h, {Act::Normed, l, rows});
  ops.linear({l, Weight::GateUp, {Act::Normed, l, rows}, {Act::Mlp, l, rows}, Epilogue::GatedAct});
  ops.linear({l, Weight::Down, {Act::Mlp, l, rows}, h, Epilogue::Residual, h});
}

}  // namespace

void queries(const ModelConfig&, Ops& ops, int l) {
  ops.norm(l, Norm::Input, {Act::Stream, l}, {Act::Normed, l});
  ops.linear({l, Weight::Q, {Act::Normed, l}, {Act::Qkv, l}});
  ops.rope(l);
}

void mamba_inputs(const ModelConfig&, Ops& ops, int l) {
  ops.norm(l, Norm::Input, {Act::Stream, l}, {Act::Normed, l});
  ops.linear({l, Weight::InProj, {Act::Normed, l}, {Act::Xz, l}});
  ops.conv(l);
  ops.linear({l, Weight::XProj, {Act::U, l}, {Act::Xdbl, l}});
  ops.linear({l, Weight::DtProj, {Act::Xdbl, l}, {Act::Dt, l}});
}

void layer(const ModelConfig& cfg, Ops& ops, int l, float lambda, bool last_only, const Hooks* hooks,
           const AttnEdit* edit) {
  const Rows rows = last_only ? Rows::Last : Rows::New;
  at(hooks, HookPoint::BlockIn, l, {Act::Stream, l}, ops);
  Rows mixed = Rows::New;  // the rows the mixer leaves in Stream(l + 1)
  switch (cfg.kind(l)) {
    case LayerKind::Mamba:
    case LayerKind::Memory: mamba_block(cfg, ops, l); break;
    case LayerKind::Gmu: gmu_block(ops, l); break;
    default:
      attention_block(cfg, ops, l, lambda, rows, hooks, edit);
      mixed = rows;
  }
  at(hooks, HookPoint::MixerOut, l, {Act::Stream, l + 1, mixed}, ops);
  if (ops.cancelled()) throw ForwardCancelled(l);
  mlp_block(ops, l, rows);
  at(hooks, HookPoint::BlockOut, l, {Act::Stream, l + 1, rows}, ops);
}

bool last_rows_only(const Plan& plan) {
  return plan.last_rows_only && !(plan.hooks && plan.hooks->needs_all_rows());
}

void run_layers(const ModelConfig& cfg, Ops& ops, const Plan& plan) {
  const int L = int(cfg.layers);
  const int end = plan.to_layer < 0 ? L : std::min(plan.to_layer, L);
  if (plan.from_layer == 0) ops.embed();
  const bool last_only = last_rows_only(plan);
  for (int l = plan.from_layer; l < end; ++l) {
    if (ops.cancelled()) throw ForwardCancelled(l);
    const float lam = cfg.is_diff() && cfg.has_maps(l) && plan.lambda ? plan.lambda[l] : 0.f;
    const AttnEdit* edit = plan.edits && size_t(l) < plan.edits->size() ? &(*plan.edits)[size_t(l)] : nullptr;
    ops.layer_begin(l);
    layer(cfg, ops, l, lam, last_only && l == L - 1, plan.hooks, edit);
    ops.layer_end(l);
    if (ops.cancelled()) throw ForwardCancelled(l);  // the layer stopped halfway: it and those above are stale
  }
}

void logits(const ModelConfig& cfg, Ops& ops, Rows rows) { lens(cfg, ops, int(cfg.layers) - 1, rows); }

void lens(const ModelConfig& cfg, Ops& ops, int layer, Rows rows) {
  const int L = int(cfg.layers);
  ops.norm(L, Norm::Final, {Act::Stream, layer + 1, rows}, {Act::Normed, L, rows});
  ops.linear({-1, Weight::LmHead, {Act::Normed, L, rows}, {Act::Logits, L, rows}});
}

}  // namespace ds::fwd
