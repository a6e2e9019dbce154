// The GUI's settings file (app/gui/settings.cpp): every key is validated on its own, so a damaged or hand-edited file
// keeps the good keys and never reaches ImGui with a value that aborts the program (a font size of 0 did).
#include <gtest/gtest.h>

#include "app/gui/settings.h"

namespace {

TEST(GuiSettings, BadValuesKeepTheirDefaults) {
  const ds::gui::Settings def;
  for (const char* text : {"{\"font_size\": 0}", "{\"font_size\": -3}", "{\"font_size\": 1e300}",
                           "{\"font_size\": \"big\"}", "{\"font_size\": null}", "{\"font_size\": 1000}"}) {
    const ds::gui::Settings s = ds::gui::parse_settings(text);
    EXPECT_EQ(s.font_size, def.font_size) << text;
  }
  const ds::gui::Settings s =
      ds::gui::parse_settings("{\"font_size\": 0, \"seq_cmap\": 7, \"overview_mode\": -1, \"dark\": false, "
                              "\"recent\": [\"/m/a\", 5, \"\", \"/m/b\"], \"export_dir\": [1]}");
  EXPECT_EQ(s.font_size, def.font_size);
  EXPECT_EQ(s.seq_cmap, def.seq_cmap);
  EXPECT_EQ(s.overview_mode, def.overview_mode);
  EXPECT_FALSE(s.dark);  // a good key next to bad ones is kept
  EXPECT_EQ(s.recent, (std::vector<std::string>{"/m/a", "/m/b"}));
  EXPECT_EQ(s.export_dir, def.export_dir);
  EXPECT_EQ(ds::gui::parse_settings("{\"font_size\": 20, \"seq_cmap\": 1}").font_size, 20.0f);
  EXPECT_EQ(ds::gui::parse_settings("{\"font_size\": 20, \"seq_cmap\": 1}").seq_cmap, 1);
}

TEST(GuiSettings, MalformedOrDeepFilesGiveDefaults) {
  const ds::gui::Settings def;
  for (const std::string text :
       {std::string("not json"), std::string("[1, 2]"), std::string("{\"dark\": false"),
        "{\"recent\": " + std::string(100000, '[') + std::string(100000, ']') + "}"}) {
    const ds::gui::Settings s = ds::gui::parse_settings(text);
    EXPECT_EQ(s.dark, def.dark);
    EXPECT_TRUE(s.recent.empty());
  }
}

}  // namespace
