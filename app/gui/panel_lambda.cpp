// Lambda panel: per layer the checkpoint's lambda times a global scale, or an absolute override, as sliders that
// re-run the model while dragging (the worker coalesces: only the newest state runs); and the lambda sweep of the
// selected layer: next-token log-probability of the current top token and the selected head's difference entropy
// against lambda, where lambda = 0 is plain softmax attention.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

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
  for (const HeadMix& x : st.req.head_mixes)  // a head with its own lambda does not follow the layer's
    if (x.layer == sw.layer && x.lambda)
      ImGui::TextDisabled("head %d keeps its own %s (%.3g) along the sweep", x.head, st.lam(), double(*x.lambda));
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

// What applies to every model with attention, whether or not it has a lambda: the interventions in force, the
// quantisation what-if and attention knockout; for a differential model, the selected head's own lambda.
static void edit_controls(AppState& st, const ModelInfo& m) {
  // Interventions (the head panel's ablate / -A1 / -A2 boxes, knockouts typed here, --ablate / --knockout), as the
  // engine lists them for the result on screen.
  // The interventions asked for (the head panel's boxes, the head's own lambda below, knockouts typed here,
  // --ablate / --head-lambda / --knockout), each with its button to take it back; the engine refuses a bad one once
  // (an error) and runs the others.
  struct Item {
    std::string label;
    std::function<void()> remove;
    std::string refused;  // why the session did not take it ("": in force)
  };
  std::vector<Item> items;
  const Snapshot::Refused* rf = st.snap->refused.get();
  auto why = [](const auto& list, const auto& x) {  // the reason an entry was refused, or ""
    for (const auto& [e, w] : list)
      if (e == x) return w;
    return std::string();
  };
  auto head = [](int l, int h) { return std::to_string(l) + "." + std::to_string(h); };
  char buf[96];
  for (size_t i = 0; i < st.req.head_scales.size(); ++i) {
    const HeadScale& x = st.req.head_scales[i];
    if (x.factor == 0.f) std::snprintf(buf, sizeof buf, "%s ablated", head(x.layer, x.head).c_str());
    else std::snprintf(buf, sizeof buf, "%s x%.3g", head(x.layer, x.head).c_str(), double(x.factor));
    items.push_back({buf, [&st, i] { st.req.head_scales.erase(st.req.head_scales.begin() + long(i)); },
                     rf ? why(rf->scales, x) : ""});
  }
  for (size_t i = 0; i < st.req.head_means.size(); ++i) {
    const auto& x = st.req.head_means[i];
    items.push_back({head(x.first, x.second) + " mean",
                     [&st, i] { st.req.head_means.erase(st.req.head_means.begin() + long(i)); }, rf ? why(rf->means, x) : ""});
  }
  for (size_t i = 0; i < st.req.head_mixes.size(); ++i) {
    const HeadMix& x = st.req.head_mixes[i];
    std::string what = head(x.layer, x.head);
    if (x.drop_a1) what += " -A1";
    if (x.lambda && *x.lambda == 0.f) what += " -A2";
    else if (x.lambda) std::snprintf(buf, sizeof buf, " %s=%.3g", st.lam(), double(*x.lambda)), what += buf;
    items.push_back({what, [&st, i] { st.req.head_mixes.erase(st.req.head_mixes.begin() + long(i)); },
                     rf ? why(rf->mixes, x) : ""});
  }
  for (size_t i = 0; i < st.req.knockouts.size(); ++i)
    items.push_back({"knockout " + knockout_text(st.req.knockouts[i]),
                     [&st, i] { st.req.knockouts.erase(st.req.knockouts.begin() + long(i)); },
                     rf ? why(rf->knockouts, st.req.knockouts[i]) : ""});
  if (!items.empty()) {
    ImGui::TextUnformatted("interventions:");
    std::function<void()> remove;
    for (size_t i = 0; i < items.size(); ++i) {
      ImGui::PushID(int(i));
      const bool refused = !items[i].refused.empty();
      const std::string label = items[i].label + (refused ? " (not applied)  x" : "  x");
      same_line_if_fits(button_w(label.c_str()));
      if (refused) ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(theme_colors().plot_b));
      if (ImGui::SmallButton(label.c_str())) remove = items[i].remove;
      if (refused) ImGui::PopStyleColor();
      if (refused)
        item_tooltip("Not applied: %s\nRemove it (the others stay in force)", items[i].refused.c_str());
      else
        item_tooltip("Take this intervention back (a re-run from its first layer)");
      ImGui::PopID();
    }
    same_line_if_fits(button_w("restore all"));
    if (ImGui::SmallButton("restore all")) {
      remove = [&st] {
        st.req.head_scales.clear();
        st.req.head_mixes.clear();
        st.req.head_means.clear();
        st.req.knockouts.clear();
      };
    }
    item_tooltip("Take every intervention back: ablations, dropped maps, heads' own lambdas and knockouts (the\n"
                 "layers' lambdas and the quantisation stay as they are)");
    if (remove) {
      remove();
      st.submit_now();
    }
  }
  {  // the quantisation what-if (the paper's Figure 8): full precision, then 16 down to 2 bits (the engine's range)
    static const char* const names[] = {"full precision", "16 bits", "15 bits", "14 bits", "13 bits", "12 bits",
                                        "11 bits",        "10 bits", "9 bits",  "8 bits",  "7 bits",  "6 bits",
                                        "5 bits",         "4 bits",  "3 bits",  "2 bits"};
    constexpr int kNames = int(sizeof names / sizeof names[0]);
    int cur = st.req.logit_bits >= 2 && st.req.logit_bits <= 16 ? 17 - st.req.logit_bits : 0;
    ImGui::SetNextItemWidth(130);
    if (ImGui::Combo("attention logits", &cur, names, kNames)) {
      st.req.logit_bits = cur == 0 ? 0 : 17 - cur;
      st.submit_now();
    }
    item_tooltip("Fake-quantise every attention logit before the softmax (symmetric, absmax per query row and head;\n"
                 "the paper's Figure 8): the maps, the predictions and the statistics become the quantised model's.");
    const auto& res = st.snap->result;
    if (st.req.logit_bits > 0 && res && res->logit_bits == st.req.logit_bits) {
      const auto& qv = st.snap->quant;
      same_line_if_fits(button_w("vs full precision"));
      if (ImGui::SmallButton("vs full precision")) {
        ++st.req.quant_report_seq;
        st.submit_now();
      }
      item_tooltip("Runs the prompt at full precision and quantised again: the KL divergence of the next token's\n"
                   "distribution from full precision's, and the largest change of A1 - lambda A2 over the last\n"
                   "position's attention rows (diffscope-run --quantize-logits BITS).");
      if (qv && qv->result_seq == res->seq && qv->q.bits == st.req.logit_bits) {
        const std::string map = m.cfg.is_diff() ? std::string("A1 - ") + st.lam() + "A2" : "A";
        const std::string top = qv->q.top_quantised == qv->q.top_full
                                    ? "the same"
                                    : "changed (" + std::to_string(qv->q.top_full) + " -> " +
                                          std::to_string(qv->q.top_quantised) + ")";
        ImGui::TextWrapped("%d bits vs full precision: KL %s nats; largest change of %s: %s; top-1 %s", qv->q.bits,
                           fmt_value(qv->q.kl).c_str(), map.c_str(), fmt_value(qv->q.max_diff_change).c_str(),
                           top.c_str());
      }
    }
  }
  ImGui::SetNextItemWidth(160);
  const bool enter = ImGui::InputTextWithHint("##ko", "L:Q0:Q1,K0:K1", st.knockout_input, sizeof st.knockout_input,
                                              ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  if ((ImGui::SmallButton("knock out") || enter) && st.knockout_input[0]) {
    try {  // checked here against the model and the prompt on screen: a bad one stays in the field to be fixed
      const Knockout k = parse_knockout(st.knockout_input, int(m.cfg.layers));
      check_knockout(m.cfg, k);
      if (const auto& res = st.snap->result) resolve_knockout(k, int64_t(res->ids.size()), res->prompt_len);
      st.req.knockouts.push_back(k);
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

  if (m.cfg.is_diff() && m.cfg.has_maps(st.layer)) {  // the selected head's own lambda (--head-lambda L.H=V)
    auto it = std::find_if(st.req.head_mixes.begin(), st.req.head_mixes.end(),
                           [&](const HeadMix& x) { return x.layer == st.layer && x.head == st.head; });
    // (a lambda of 0 is the -A2 box's: the own lambda takes over from it when ticked)
    bool own = it != st.req.head_mixes.end() && it->lambda.has_value() && *it->lambda != 0.f;
    const double layer_lambda = st.req.lambda.override_.size() > size_t(st.layer) && st.req.lambda.override_[size_t(st.layer)]
                                    ? *st.req.lambda.override_[size_t(st.layer)]
                                    : m.model_lambda[size_t(st.layer)] * st.req.lambda.scale;
    float v = own ? *it->lambda : float(layer_lambda);
    char label[48];
    std::snprintf(label, sizeof label, "own %s of head %d.%d", st.lam(), st.layer, st.head);
    if (ImGui::Checkbox(label, &own)) {
      if (own && it == st.req.head_mixes.end()) it = st.req.head_mixes.insert(st.req.head_mixes.end(), HeadMix{st.layer, st.head});
      if (it != st.req.head_mixes.end()) {
        it->lambda = own ? std::optional<float>(v) : std::nullopt;
        if (!it->drop_a1 && !it->lambda) st.req.head_mixes.erase(it);
      }
      st.submit_now();
    }
    item_tooltip("This head alone takes its own lambda (its difference map and its output); the other heads keep\n"
                 "the layer's. 0 drops A2 (the head panel's -A2 box). diffscope-run --head-lambda L.H=V.");
    if (own) {
      ImGui::SameLine();
      ImGui::SetNextItemWidth(-1);
      if (ImGui::SliderFloat("##headlam", &v, -1.0f, 2.0f, "%.3f")) {
        it->lambda = v;
        st.submit_now();
      }
    }
  }
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
  item_tooltip("Every layer's lambda back to the checkpoint's (scale 1, no override); the interventions, heads' own\n"
               "lambdas among them, stay: 'restore all' in their list takes them back");
  ImGui::SameLine();
  if (ImGui::Button("x0 = softmax"))
    st.set_lambda_scale(0.0);
  ImGui::SameLine();
  if (ImGui::Button("x1"))
    st.set_lambda_scale(1.0);
  edit_controls(st, m);
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
  if (!m.cfg.is_diff()) {  // no lambda; the interventions, quantisation and knockout apply all the same
    ImGui::TextDisabled("%s", (std::string("This is a ") + m.cfg.family() +
                               " model: one softmax per head, no lambda.").c_str());
    edit_controls(st, m);
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
