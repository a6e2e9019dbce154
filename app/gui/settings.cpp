// Settings persistence (JSON). See settings.h.
#include "settings.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/core/input_limits.h"
#include "engine/core/safe_write.h"

namespace ds::gui {

namespace fs = std::filesystem;

void Settings::add_recent(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/')
    d.pop_back();
  std::erase(recent, d);
  recent.insert(recent.begin(), d);
  if (recent.size() > 10)
    recent.resize(10);
}

std::string config_dir() {
  fs::path base;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x)
    base = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    base = fs::path(h) / ".config";
  else
    return {};
  std::error_code ec;
  fs::create_directories(base / "diffscope", ec);
  return (base / "diffscope").string();
}

// Every key is checked on its own: a value of the wrong type or out of range keeps that key's default (and the others
// their values), so a damaged or hand-edited file can neither abort the program (an ImGui assertion on a font size
// of 0, an out-of-range colour map index) nor cost the user the rest of their settings.
Settings parse_settings(const std::string& text) {
  Settings s;
  nlohmann::json j;
  try {
    j = ds::parse_json(text, "settings.json");
  } catch (const std::exception&) {
    return s;  // not worth an error dialog: start from defaults
  }
  if (!j.is_object())
    return s;
  auto get_bool = [&](const char* k, bool& v) {
    if (j.contains(k) && j[k].is_boolean())
      v = j[k].get<bool>();
  };
  auto get_int = [&](const char* k, int& v, int lo, int hi) {
    if (j.contains(k) && j[k].is_number_integer()) {
      const int64_t x = j[k].get<int64_t>();
      if (x >= lo && x <= hi)
        v = int(x);
    }
  };
  get_bool("dark", s.dark);
  get_int("seq_cmap", s.seq_cmap, 0, 1);  // Viridis, Magma
  get_bool("log_scale", s.log_scale);
  get_bool("hide_first", s.hide_first);
  get_bool("link_scales", s.link_scales);
  get_bool("robust_range", s.robust_range);
  get_bool("mean_pool", s.mean_pool);
  get_int("overview_mode", s.overview_mode, 0, 63);  // clamped to the modes there are where it is used
  get_bool("sweep", s.sweep);
  if (j.contains("font_size") && j["font_size"].is_number()) {
    const double f = j["font_size"].get<double>();
    if (std::isfinite(f) && f >= kMinFontSize && f <= kMaxFontSize)
      s.font_size = float(f);
  }
  if (j.contains("export_dir") && j["export_dir"].is_string() && j["export_dir"].get<std::string>().size() < 4096)
    s.export_dir = j["export_dir"].get<std::string>();
  if (j.contains("recent") && j["recent"].is_array())
    for (const auto& r : j["recent"])
      if (r.is_string() && !r.get<std::string>().empty() && r.get<std::string>().size() < 4096 && s.recent.size() < 10)
        s.recent.push_back(r.get<std::string>());
  return s;
}

Settings load_settings() {
  const std::string dir = config_dir();
  if (dir.empty())
    return Settings{};
  try {
    return parse_settings(ds::read_text_file((fs::path(dir) / "settings.json").string(), 1 << 20, "settings file"));
  } catch (const std::exception&) {
    return Settings{};  // missing, not a file, or too large: defaults
  }
}

void save_settings(const Settings& s) {
  const std::string dir = config_dir();
  if (dir.empty())
    return;
  nlohmann::json j = {{"recent", s.recent},
                      {"dark", s.dark},
                      {"seq_cmap", s.seq_cmap},
                      {"log_scale", s.log_scale},
                      {"hide_first", s.hide_first},
                      {"link_scales", s.link_scales},
                      {"robust_range", s.robust_range},
                      {"mean_pool", s.mean_pool},
                      {"overview_mode", s.overview_mode},
                      {"sweep", s.sweep},
                      {"font_size", s.font_size},
                      {"export_dir", s.export_dir}};
  try {
    ds::write_file_safely((fs::path(dir) / "settings.json").string(), j.dump(2) + "\n", "the settings");
  } catch (const std::exception&) {
    // settings are a convenience: a read-only home keeps the defaults next time
  }
}

}  // namespace ds::gui
