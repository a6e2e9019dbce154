// Every panel of the window, one file each (panel_*.cpp), and the frame that lists them (frame.cpp).
#pragma once
#include <imgui.h>

#include "app_state.h"
#include "widgets.h"

namespace ds::gui {

// [SECTION] the frame: a flat list of `if (show_x) draw_x();`
void draw_frame(AppState& st);

// [SECTION] panels
void draw_menu_bar(AppState& st);        // panel_menu.cpp (and the keyboard shortcuts it lists)
void handle_shortcuts(AppState& st);     // panel_menu.cpp
void draw_model_panel(AppState& st);     // panel_model.cpp
void draw_prompt_panel(AppState& st);    // panel_prompt.cpp
void draw_generate_panel(AppState& st);  // panel_generate.cpp
void draw_overview_panel(AppState& st);  // panel_overview.cpp
void draw_head_panel(AppState& st);      // panel_head.cpp
void draw_lambda_panel(AppState& st);    // panel_lambda.cpp
void draw_profiler_panel(AppState& st);  // panel_profiler.cpp
void draw_row_panel(AppState& st);       // panel_row.cpp
void draw_corpus_panel(AppState& st);    // panel_corpus.cpp
void draw_compare_panel(AppState& st);   // panel_compare.cpp
void draw_status(AppState& st);          // panel_status.cpp: error modal, toasts, shortcut help

// [SECTION] panel frame (panel_layout.cpp): default tiling, rectangle bookkeeping for PNG export
// Corpus takes the overview's and the lambda panel's place, over them, while it is shown.
enum class Slot { Model, Prompt, Generate, Lambda, Head, Row, Overview, Profiler, Corpus };
bool begin_panel(AppState& st, const char* name, bool* open, Slot slot, ImGuiWindowFlags flags = 0);
void end_panel();

}  // namespace ds::gui
