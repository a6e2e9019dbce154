// The widgets and formats every panel shares (Tracy's TracyImGui.hpp pattern): empty states, headings, tooltips,
// the widths of buttons and checkboxes for rows that wrap, and how numbers and tokens are written.
#pragma once
#include <string>

#include <imgui.h>

namespace ds::gui {

// A centred, wrapped, dimmed message for empty states ("what to do next").
void empty_state(const char* text);
// A small heading followed by a separator.
void section_title(const char* text);
// The last item's tooltip (printf format), also while it is disabled.
void item_tooltip(const char* fmt, ...) IM_FMTARGS(1);
// SameLine when an item `w` wide still fits on this line, else a new line (narrow panels wrap their rows).
void same_line_if_fits(float w);
float button_w(const char* label);    // a button's width for its label
float checkbox_w(const char* label);  // a checkbox's width with its label
// "value" with 3 significant digits, small numbers in scientific notation.
std::string fmt_value(double v);
// A token as a label: leading space as a middle dot, newlines and tabs escaped, cut to max_chars.
std::string token_label(const std::string& text, size_t max_chars = 14);

}  // namespace ds::gui
