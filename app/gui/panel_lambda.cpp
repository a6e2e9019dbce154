// Lambda panel: per layer the checkpoint's lambda times a global scale, or an absolute override, as sliders that
// re-run the model while dragging (the worker coalesces: only the newest state runs); and the lambda sweep of the
// selected layer: next-token log-probability of the current top token and the selected head's difference entropy
// against lambda, where lambda = 0 is plain softmax attention.
#include <imgui.h>

#include <cmath>
#include <cstdio>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"

namespace ds::gui {

static void sweep_plot(AppState& st, const Snapshot& s) {
  ImGui::Checkbox("sweep the selected layer", &st.settings.sweep);  // frame.cpp forwards it to the worker
  if (!st.settings.sweep)
    return;
  if (s.model && !s.model->cfg.has_maps(st.layer)) {  // the head view is on a Mamba layer: nothing to sweep
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("Layer %d is a %s layer: it has no lambda. Select an attention layer to sweep.", st.layer,
                        layer_kind_name(s.model->cfg.kind(st.layer)));
    ImGui::PopTextWrapPos();
    return;
  }
  if (!s.sweep || s.sweep->points.empty()) {
    ImGui::TextDisabled(s.running ? "sweeping..." : "Run a prompt to sweep lambda.");
    return;
  }
  const Sweep& sw = *s.sweep;
  const std::string tok = token_label(sw.token_text, 16);
  ImGui::TextWrapped("layer %d, head %d%s: log p(\"%s\") and entropy of |A1 - %s*A2|", sw.layer, sw.head,
                     sw.complete ? "" : " (running)", tok.c_str(), st.lam());
  // The entropy curve comes whole at once (no re-run); log p fills in point by point as the re-runs finish.
  std::vector<float> x, lp, ent, xlp;
  for (const auto& p : sw.points) {
    x.push_back(float(p.lambda));
    ent.push_back(float(p.entropy));
    if (std::isfinite(p.logprob)) {
      xlp.push_back(float(p.lambda));
      lp.push_back(float(p.logprob));
    }
  }
  const ThemeColors& tc = theme_colors();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float h = std::max(90.0f, ImGui::GetContentRegionAvail().y - ImGui::GetTextLineHeightWithSpacing() - 4);
  const ImVec2 p1(p0.x + ImGui::GetContentRegionAvail().x, p0.y + h);
  const std::string xname = std::string(st.lam()) + " of layer " + std::to_string(sw.layer);
  draw_dual_plot(ImGui::GetWindowDrawList(), p0, p1, Series{&xlp, &lp, tc.plot_a, "log p"},
                 Series{&x, &ent, tc.plot_b, "entropy"}, float(sw.current_lambda), xname.c_str());
  ImGui::Dummy(ImVec2(p1.x - p0.x, h));
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(tc.plot_a), "%s",
                     st.greek ? "\xe2\x80\x94 log p (left)" : "- log p (left)");
  ImGui::SameLine();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(tc.plot_b), "%s",
                     st.greek ? "\xe2\x80\x94 entropy, nats (right)" : "- entropy, nats (right)");
  ImGui::SameLine();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(tc.selection), "| current");
}

static void lambda_controls(AppState& st, const ModelInfo& m, float table_h) {
  LambdaControl& lc = st.req.lambda;
  float scale = float(lc.scale);
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x - ImGui::CalcTextSize("global scale").x - 8);
  if (ImGui::SliderFloat("global scale", &scale, -1.0f, 3.0f, "x %.3f"))
    st.set_lambda_scale(scale);
  item_tooltip(
               "Multiplies every layer's checkpoint lambda (layers without an override).\n"
               "0 turns every layer into plain softmax attention. Ctrl+click to type a value.");
  if (ImGui::Button("reset (Ctrl+R)"))
    st.reset_lambda();
  ImGui::SameLine();
  if (ImGui::Button("x0 = softmax"))
    st.set_lambda_scale(0.0);
  ImGui::SameLine();
  if (ImGui::Button("x1"))
    st.set_lambda_scale(1.0);
  // Interventions (the head panel's ablate / -A1 / -A2 boxes, knockouts typed here, --ablate / --knockout), as the
  // engine lists them for the result on screen.
  if (st.snap->result && !st.snap->result->intervention_lines.empty()) {
    std::string list;
    for (const std::string& x : st.snap->result->intervention_lines) list += (list.empty() ? "" : "; ") + x;
    ImGui::TextWrapped("interventions: %s", list.c_str());
    same_line_if_fits(button_w("restore all"));
    if (ImGui::SmallButton("restore all")) {
      st.req.head_scales.clear();
      st.req.head_mixes.clear();
      st.req.head_means.clear();
      st.req.knockouts.clear();
      st.submit_now();
    }
  }
  {  // the quantisation what-if (the paper's Figure 8)
    static const int bits[] = {0, 16, 8, 6, 4};
    const char* names[] = {"full precision", "16 bits", "8 bits", "6 bits", "4 bits"};
    int cur = 0;
    for (int i = 0; i < 5; ++i)
      if (bits[i] == st.req.logit_bits) cur = i;
    ImGui::SetNextItemWidth(130);
    if (ImGui::Combo("attention logits", &cur, names, 5)) {
      st.req.logit_bits = bits[cur];
      st.submit_now();
    }
    item_tooltip("Fake-quantise every attention logit before the softmax (symmetric, absmax per query row and head;\n"
                 "the paper's Figure 8): the maps, the predictions and the statistics become the quantised model's.\n"
                 "diffscope-run --quantize-logits BITS reports the KL from full precision.");
  }
  ImGui::SetNextItemWidth(160);
  const bool enter = ImGui::InputTextWithHint("##ko", "L:Q0:Q1,K0:K1", st.knockout_input, sizeof st.knockout_input,
                                              ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  if ((ImGui::SmallButton("knock out") || enter) && st.knockout_input[0]) {
    try {
      st.req.knockouts.push_back(parse_knockout(st.knockout_input, int(m.cfg.layers)));
      st.knockout_input[0] = 0;
      st.submit_now();
    } catch (const std::exception& e) {
      st.show_error(e.what());
    }
  }
  item_tooltip("Attention knockout: query positions [Q0, Q1) of layer L do not see keys [K0, K1), in both maps.\n"
               "L: a layer, a range A-B or all; below 0 counts from the prompt's end (-1: its last token; Q1 left\n"
               "empty after it: to the end, generated tokens included). E.g. all:-1:,5:9 hides keys 5..8 from the\n"
               "last prompt token and every generated one in every layer.");

  const ImGuiTableFlags tf = ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY;
  if (!ImGui::BeginTable("lam", 4, tf, ImVec2(0, table_h)))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("layer");
  ImGui::TableSetupColumn("model");
  ImGui::TableSetupColumn("fix");
  ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableHeadersRow();
  for (int l = 0; l < int(m.cfg.layers) && l < int(lc.override_.size()); ++l) {
    if (!m.cfg.has_maps(l))
      continue;  // hybrids: Mamba and GMU layers have no lambda
    ImGui::PushID(l);
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    if (l == st.layer)
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().selection), "L%d", l);
    else
      ImGui::Text("L%d", l);
    if (m.cfg.kinds.size() && ImGui::IsItemHovered())
      ImGui::SetTooltip("layer %d: %s", l, m.cfg.layer_label(l).c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%.3f", m.model_lambda[l]);
    ImGui::TableNextColumn();
    bool fixed = lc.override_[l].has_value();
    const double effective = fixed ? *lc.override_[l] : m.model_lambda[l] * lc.scale;
    if (ImGui::Checkbox("##fix", &fixed)) {
      lc.override_[l] = fixed ? std::optional<double>(effective) : std::nullopt;
      st.submit();
    }
    item_tooltip("Override: this layer keeps its own value, whatever the scale");
    ImGui::TableNextColumn();
    float v = float(effective);
    ImGui::SetNextItemWidth(-1);
    if (!fixed)
      ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(theme_colors().text_dim));
    if (ImGui::SliderFloat("##v", &v, -1.0f, 2.0f, "%.3f")) {
      lc.override_[l] = double(v);  // dragging a layer's slider overrides that layer
      st.submit_now();
    }
    if (!fixed)
      ImGui::PopStyleColor();
    ImGui::PopID();
  }
  ImGui::EndTable();
}

void draw_lambda_panel(AppState& st) {
  char title[64];
  std::snprintf(title, sizeof title, "%s###Lambda", st.greek ? "\xce\xbb controls" : "Lambda controls");
  if (!begin_panel(st, title, &st.show_lambda, Slot::Lambda))
    return end_panel();
  const Snapshot& s = *st.snap;
  if (!s.model) {
    empty_state("Open a differential model (DiffLlama, Motif, Phi-4-mini-flash) to move its lambda.");
    return end_panel();
  }
  const ModelInfo& m = *s.model;
  if (!m.cfg.is_diff()) {
    empty_state((std::string("This is a ") + m.cfg.family() +
                 " model: one softmax per head, no lambda. Open a differential checkpoint to compare.")
                    .c_str());
    return end_panel();
  }
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  if (avail.x >= 560) {  // controls and sweep side by side
    ImGui::BeginChild("##controls", ImVec2(avail.x * 0.46f, 0));
    lambda_controls(st, m, ImGui::GetContentRegionAvail().y);
    ImGui::EndChild();
    ImGui::SameLine();
    ImGui::BeginChild("##sweep", ImVec2(0, 0));
    sweep_plot(st, s);
    ImGui::EndChild();
  } else {
    lambda_controls(st, m, std::max(90.0f, avail.y - (st.settings.sweep ? 240.0f : 60.0f)));
    sweep_plot(st, s);
  }
  end_panel();
}

}  // namespace ds::gui
