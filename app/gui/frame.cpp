// One frame of the UI: a flat list of panels (tracy's TracyView.cpp pattern), then the transient windows.
#include "panels.h"
#include "theme.h"

namespace ds::gui {

void draw_frame(AppState& st) {
  if (theme_is_dark() != st.settings.dark)
    apply_theme(st.settings.dark);
  // What the engine computes follows what is on screen: no overview summaries or sweeps for hidden panels.
  const bool want_sweep = st.show_lambda && st.settings.sweep;
  if (st.req.overview != st.show_overview || st.req.sweep != want_sweep) {
    st.req.overview = st.show_overview;
    st.req.sweep = want_sweep;
    st.submit();
  }
  handle_shortcuts(st);
  draw_menu_bar(st);
  if (st.show_model)
    draw_model_panel(st);
  if (st.show_prompt)
    draw_prompt_panel(st);
  if (st.show_generate)
    draw_generate_panel(st);
  if (st.show_lambda)
    draw_lambda_panel(st);
  if (st.show_head)
    draw_head_panel(st);
  if (st.show_row)
    draw_row_panel(st);
  if (st.show_overview)
    draw_overview_panel(st);
  if (st.show_profiler)
    draw_profiler_panel(st);
  if (st.show_corpus)  // after the overview and the lambda panel: it starts over them
    draw_corpus_panel(st);
  if (st.show_compare)
    draw_compare_panel(st);
  draw_status(st);
  if (st.show_imgui_demo)
    ImGui::ShowDemoWindow(&st.show_imgui_demo);
  st.reset_layout = false;
}

}  // namespace ds::gui
