// What diffscope remembers between runs: recent models, theme, colour and display options, the export folder.
// Stored as JSON in $XDG_CONFIG_HOME/diffscope/settings.json (else ~/.config/diffscope/); ImGui's own window
// layout goes to imgui.ini beside it. --screenshot runs neither read nor write them, so tests are hermetic.
#pragma once
#include <string>
#include <vector>

namespace ds::gui {

struct Settings {
  std::vector<std::string> recent;  // most recent first
  bool dark = true;
  int seq_cmap = 0;  // Colormap::Viridis / Magma for A1 and A2
  bool log_scale = false;
  bool hide_first = false;
  bool link_scales = true;   // A1 and A2 share one colour range
  bool robust_range = true;  // colour range to the 99.5th percentile instead of the max
  bool mean_pool = false;    // head view: a pooled cell shows its block's mean instead of its max
  int overview_mode = 0;
  bool sweep = true;
  float font_size = 15.0f;
  std::string export_dir;  // empty: the current directory

  void add_recent(const std::string& dir);
};

constexpr float kMinFontSize = 8.0f, kMaxFontSize = 48.0f;

std::string config_dir();  // created on demand; empty if no home can be found
Settings load_settings();  // defaults when missing or unreadable
Settings parse_settings(const std::string& text);  // the file's text: each bad or missing key keeps its default
void save_settings(const Settings& s);

}  // namespace ds::gui
