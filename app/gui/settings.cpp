// Settings persistence (JSON). See settings.h.
#include "settings.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

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

Settings load_settings() {
  Settings s;
  const std::string dir = config_dir();
  if (dir.empty())
    return s;
  std::ifstream f(fs::path(dir) / "settings.json");
  if (!f)
    return s;
  try {
    const auto j = nlohmann::json::parse(f);
    s.recent = j.value("recent", s.recent);
    s.dark = j.value("dark", s.dark);
    s.seq_cmap = j.value("seq_cmap", s.seq_cmap);
    s.log_scale = j.value("log_scale", s.log_scale);
    s.hide_first = j.value("hide_first", s.hide_first);
    s.link_scales = j.value("link_scales", s.link_scales);
    s.robust_range = j.value("robust_range", s.robust_range);
    s.mean_pool = j.value("mean_pool", s.mean_pool);
    s.overview_mode = j.value("overview_mode", s.overview_mode);
    s.sweep = j.value("sweep", s.sweep);
    s.font_size = j.value("font_size", s.font_size);
    s.export_dir = j.value("export_dir", s.export_dir);
  } catch (const std::exception&) {
    return Settings{};  // a damaged settings file is not worth an error dialog: start from defaults
  }
  return s;
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
  const fs::path tmp = fs::path(dir) / "settings.json.tmp";
  {
    std::ofstream f(tmp);
    if (!f)
      return;
    f << j.dump(2) << "\n";
  }
  std::error_code ec;
  fs::rename(tmp, fs::path(dir) / "settings.json", ec);
}

}  // namespace ds::gui
