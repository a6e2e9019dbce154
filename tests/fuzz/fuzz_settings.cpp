// Fuzz the GUI's settings file: whatever it holds, every value that comes out is one the GUI can use.
#include <cmath>
#include <cstdlib>
#include <string>

#include "app/gui/settings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ds::gui::Settings s = ds::gui::parse_settings(std::string(reinterpret_cast<const char*>(data), size));
  if (!(s.font_size >= ds::gui::kMinFontSize && s.font_size <= ds::gui::kMaxFontSize)) std::abort();
  if (s.seq_cmap < 0 || s.seq_cmap > 1 || s.overview_mode < 0 || s.recent.size() > 10) std::abort();
  return 0;
}
