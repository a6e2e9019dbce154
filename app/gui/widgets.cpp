#include "widgets.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "theme.h"

namespace ds::gui {

void empty_state(const char* text) {
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float wrap = std::max(120.0f, std::min(avail.x - 20, 520.0f));
  const ImVec2 ts = ImGui::CalcTextSize(text, nullptr, false, wrap);
  const ImVec2 cur = ImGui::GetCursorPos();
  ImGui::SetCursorPos(
      ImVec2(cur.x + std::max(0.0f, (avail.x - ts.x) * 0.5f), cur.y + std::max(0.0f, (avail.y - ts.y) * 0.4f)));
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(theme_colors().text_dim));
  ImGui::PushTextWrapPos(ImGui::GetCursorPos().x + wrap);
  ImGui::TextUnformatted(text);
  ImGui::PopTextWrapPos();
  ImGui::PopStyleColor();
}

void section_title(const char* text) {
  ImGui::Spacing();
  ImGui::TextUnformatted(text);
  ImGui::Separator();
}

void item_tooltip(const char* fmt, ...) {
  if (!ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    return;
  va_list args;
  va_start(args, fmt);
  ImGui::SetTooltipV(fmt, args);
  va_end(args);
}

void same_line_if_fits(float w) {
  const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
  ImGui::SameLine();
  if (ImGui::GetCursorScreenPos().x + w > right)
    ImGui::NewLine();
}

float button_w(const char* label) {
  return ImGui::CalcTextSize(label, nullptr, true).x + ImGui::GetStyle().FramePadding.x * 2;
}

float checkbox_w(const char* label) {
  return ImGui::GetFrameHeight() + ImGui::GetStyle().ItemInnerSpacing.x + ImGui::CalcTextSize(label, nullptr, true).x;
}

std::string fmt_value(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (v == 0)
    return "0";
  else if (a >= 1e4 || a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.2e", v);
  else if (a >= 100)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (a >= 1)
    std::snprintf(buf, sizeof buf, "%.3g", v);
  else
    std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string token_label(const std::string& text, size_t max_chars) {
  std::string out;
  size_t chars = 0;
  bool cut = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const bool continuation = (c & 0xC0) == 0x80;  // stays with its character
    if (!continuation && chars >= max_chars) {
      cut = true;
      break;
    }
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == ' ' && i == 0)
      out += "\xc2\xb7";  // middle dot: the leading space of a word token
    else
      out += char(c);
    if (!continuation)
      ++chars;
  }
  if (cut)
    out += "\xe2\x80\xa6";  // ellipsis
  return out;
}

}  // namespace ds::gui
