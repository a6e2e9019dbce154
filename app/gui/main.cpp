// diffscope: the desktop tool for differential attention. The canonical GLFW + OpenGL 3 + Dear ImGui loop
// (imgui's examples/example_glfw_opengl3): the engine runs on its own thread (worker.h), each frame takes one
// snapshot of it, draws the panels (frame.cpp) and sends at most one coalesced request back.
#include <GLFW/glfw3.h>
#include <imgui.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "app_state.h"
#include "cli_options.h"
#include "engine/core/error.h"
#include "export.h"
#include "panels.h"
#include "screenshot.h"
#include "theme.h"

#ifndef DS_ASSETS_DIR
#define DS_ASSETS_DIR "assets"
#endif

namespace fs = std::filesystem;
using namespace ds::gui;

namespace {

// The model to show when none is named: the demo model shipped in assets/, else the smallest test fixture.
std::string default_model(const std::string& assets) {
  const fs::path candidates[] = {fs::path(assets) / "models" / "diffllama-demo",
                                 fs::path(assets).parent_path() / "tests" / "fixtures" / "diff_mha_d32_f32"};
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::exists(c / "config.json", ec))
      return c.lexically_normal().string();
  }
  return {};
}

// A folder dropped on the window opens as a model; a file dropped opens its folder (config.json, *.safetensors).
void on_drop(GLFWwindow* w, int count, const char** paths) {
  auto* st = static_cast<AppState*>(glfwGetWindowUserPointer(w));
  if (!st || count < 1)
    return;
  fs::path p(paths[0]);
  std::error_code ec;
  if (!fs::is_directory(p, ec) && p.extension() == ".jsonl") {  // a corpus: into the Corpus panel's path field
    st->corpus.opts.path = p.string();
    st->raise_corpus = !st->show_corpus;
    st->show_corpus = true;
    return;
  }
  if (!fs::is_directory(p, ec))
    p = p.parent_path();
  st->path_input = p.string();
  st->open_model(p.string());
}

void on_glfw_error(int code, const char* what) {
  std::fprintf(stderr, "diffscope: GLFW error %d: %s\n", code, what);
}

}  // namespace

int main(int argc, char** argv) {
  CliOptions opt;
  std::vector<ds::BackendChoice> backends;  // --backend: one device, or a list (a layer split; the scans' replicas)
  try {
    opt = parse_cli(argc, argv);
    backends = ds::parse_backend_list(opt.backend);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diffscope: %s\n", e.what());
    return 2;
  }
  if (opt.help) {
    std::fputs(cli_usage(), stdout);
    return 0;
  }
  std::string file_prompt;
  if (!opt.prompt_file.empty()) {
    std::string why;
    if (!read_prompt_file(opt.prompt_file, file_prompt, &why)) {
      std::fprintf(stderr, "diffscope: --prompt-file: %s\n", why.c_str());
      return 2;
    }
  }
  const bool shot = !opt.screenshot.empty();

  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr,
                 "diffscope: cannot start GLFW (no display?). HINT: headless, run it under "
                 "xvfb-run -a -s \"-screen 0 1600x1000x24\"\n");
    return 1;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  GLFWwindow* window = glfwCreateWindow(opt.width, opt.height, "diffscope", nullptr, nullptr);
  if (!window) {
    std::fprintf(stderr,
                 "diffscope: cannot create an OpenGL 3.3 window. HINT: check the GPU driver, or use "
                 "Mesa (LIBGL_ALWAYS_SOFTWARE=1)\n");
    glfwTerminate();
    return 1;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(shot ? 0 : 1);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  AppState st;
  st.persist = !shot;
  st.assets_dir = DS_ASSETS_DIR;
  // Window layout goes to imgui.ini next to settings.json; --screenshot runs start from the default layout.
  const std::string ini = st.persist && !config_dir().empty() ? config_dir() + "/imgui.ini" : std::string();
  io.IniFilename = ini.empty() ? nullptr : ini.c_str();
  st.settings = st.persist ? load_settings() : Settings{};
  if (opt.dark)
    st.settings.dark = *opt.dark;
  if (opt.overview >= 0)
    st.settings.overview_mode = opt.overview;
  if (opt.mean_pool)
    st.settings.mean_pool = *opt.mean_pool;
  st.ov_mode = OverviewMode(std::clamp(st.settings.overview_mode, 0, int(OverviewMode::Count) - 1));
  st.greek = load_fonts(st.settings.font_size);
  apply_theme(st.settings.dark);
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 150");
  glfwSetWindowUserPointer(window, &st);
  glfwSetDropCallback(window, on_drop);

  st.wake = [] { glfwPostEmptyEvent(); };
  st.backends = backends;
  st.cpu_threads = opt.threads;
  st.gpu_mem_limit = opt.gpu_mem_limit;
  auto worker = std::make_unique<Worker>(st.wake, backends, opt.threads, opt.gpu_mem_limit);
  st.worker = worker.get();
  st.prompt.text = opt.prompt ? *opt.prompt : !opt.prompt_file.empty() ? file_prompt : st.default_prompt();
  st.prompt.path = opt.prompt_file;
  if (opt.ids) {
    st.prompt.ids_mode = true;
    for (size_t i = 0; i < opt.ids->size(); ++i)
      st.prompt.ids += (i ? ", " : "") + std::to_string((*opt.ids)[i]);
  }
  if (opt.layer >= 0) {
    st.layer = st.req.layer = opt.layer;
    st.head = st.req.head = opt.head;
    st.asked_head = std::pair(opt.layer, opt.head);
  }
  st.pending_scale = opt.lambda_scale;
  // Generation options from the flags (the Generate panel shows them); --generate N runs once the prompt has.
  if (opt.temperature) {
    st.generation.sample = *opt.temperature > 0;
    if (st.generation.sample)
      st.generation.temperature = *opt.temperature;
  }
  if (opt.top_p)
    st.generation.options.sampling.top_p = *opt.top_p;
  if (opt.sample_top_k)
    st.generation.options.sampling.top_k = *opt.sample_top_k;
  if (opt.seed)
    st.generation.options.sampling.seed = *opt.seed;
  st.generation.options.stop_at_eos = !opt.ignore_eos;
  st.req.max_abs_hidden = st.focus_max_abs = opt.max_abs_hidden;
  for (const auto& x : opt.ablate) {  // checked against the model once it is open (app_state.cpp: absorb_snapshot)
    const std::string head = std::to_string(x.layer) + "." + std::to_string(x.head);
    const std::string flag = x.mode == "lambda" ? "--head-lambda " + head
                             : x.mode == "head"   ? "--ablate " + head
                                                  : "--ablate " + head + ":" + x.mode;
    st.pending_head_edits.push_back({flag, x.layer, x.head, x.mode});
    if (x.mode == "head" || x.mode == "mean") {
      if (x.mode == "head") st.req.head_scales.push_back({x.layer, x.head, 0.f});
      else st.req.head_means.push_back({x.layer, x.head});
      continue;
    }
    auto it = std::find_if(st.req.head_mixes.begin(), st.req.head_mixes.end(),
                           [&](const ds::HeadMix& m) { return m.layer == x.layer && m.head == x.head; });
    if (it == st.req.head_mixes.end()) it = st.req.head_mixes.insert(st.req.head_mixes.end(), ds::HeadMix{x.layer, x.head});
    if (x.mode == "a1") it->drop_a1 = true;
    else it->lambda = x.mode == "lambda" ? x.lambda : 0.f;
  }
  st.pending_knockouts = opt.knockout;  // parsed once the model's layers are known
  st.req.lens = opt.lens;
  st.req.outliers = st.focus_outliers = opt.outliers;
  st.req.logit_bits = opt.quantize_bits;
  if (opt.quantize_bits > 0) st.req.quant_report_seq = 1;  // and against full precision, as diffscope-run reports
  if (opt.importance) {
    st.req.importance_seq = 1;
    st.ov_mode = OverviewMode::Importance;
  }
  if (opt.generate > 0)
    st.generation.options.max_new = st.generation.pending = opt.generate;
  st.generation.pending_regenerate_scale = opt.regenerate_scale;
  if (opt.row)
    st.row = st.req.row = *opt.row;
  st.asked_row = opt.row;
  st.asked_row_extra = opt.generate > 0 ? opt.generate : 0;
  if (opt.view) {  // the square of tokens around the rectangle, centred on it
    const auto& v = *opt.view;
    st.asked_view = std::array<int64_t, 4>{v[0], v[1], v[2], v[3]};
    st.view.span = double(std::max(v[1] - v[0], v[3] - v[2]));
    st.view.cq = double(v[0] + v[1]) / 2;
    st.view.ck = double(v[2] + v[3]) / 2;
  }
  // --scan: the Corpus panel's options; the scan starts once the first prompt ran (AppState::absorb_snapshot).
  if (!opt.scan.empty()) {
    st.corpus.pending = opt.scan;
    st.corpus.opts.path = opt.scan;
    st.show_corpus = true;
  }
  if (opt.scan_lambda_scale)
    st.corpus.opts.lambda_scale = *opt.scan_lambda_scale;
  if (opt.scan_compare) {
    st.corpus.opts.compare = true;
    st.corpus.opts.compare_scale = *opt.scan_compare;
  }
  if (opt.scan_max_answer)
    st.corpus.opts.max_answer_tokens = *opt.scan_max_answer;
  st.corpus.pending_open = opt.scan_open;
  st.corpus.pending_report = opt.scan_report;
  st.corpus.pending_plot = opt.scan_plot;
  st.corpus.stop_after = opt.scan_stop_after;
  if (opt.scan_view >= 0)
    st.corpus.view = opt.scan_view;
  if (opt.scan_fraction >= 0) {
    st.corpus.part = opt.scan_fraction / 4;
    st.corpus.map = opt.scan_fraction % 4;
  }
  st.req.sweep = st.settings.sweep;
  const std::string model = !opt.model.empty() ? opt.model : default_model(st.assets_dir);
  if (opt.layer < 0 && opt.model.empty()) {
    // The demo model opens on the head that finds the default prompt's answer (assets/models/default_head.txt).
    std::ifstream f(fs::path(st.assets_dir) / "models" / "default_head.txt");
    int l = -1, h = -1;
    char dot = 0;
    if (f >> l >> dot >> h && dot == '.' && l >= 0 && h >= 0) {
      st.layer = st.req.layer = l;
      st.head = st.req.head = h;
    }
  }
  st.path_input = model;
  if (!model.empty())
    st.open_model(model);
  if (!opt.compare.empty())
    st.open_compare(opt.compare);
  st.compare.answer = opt.compare_answer;

  ScreenshotDriver driver(opt);
  int rc = 0;
  while (!glfwWindowShouldClose(window) && !st.quit) {
    // Sleep until input or a worker publication when nothing moves; poll while the engine works.
    const bool busy = !worker->idle() || (st.snap && (st.snap->loading || st.snap->running)) ||
                      (st.compare.worker && !st.compare.worker->idle());
    if (shot)
      glfwWaitEventsTimeout(st.scanning() ? 0.1 : 0.02);
    else if (st.scanning() && !ImGui::IsAnyMouseDown())
      glfwWaitEventsTimeout(0.25);  // a corpus scan: its progress wakes the loop (<= 10 a second); leave it the cores
    else if (busy || ImGui::IsAnyMouseDown())
      glfwPollEvents();
    else
      glfwWaitEventsTimeout(0.5);

    st.snap = worker->snapshot();
    st.absorb_snapshot();
    st.sync_compare();
    int fb_w = 0, fb_h = 0, win_w = 0, win_h = 0;
    glfwGetFramebufferSize(window, &fb_w, &fb_h);
    glfwGetWindowSize(window, &win_w, &win_h);
    st.fb_scale = win_w > 0 ? float(fb_w) / float(win_w) : 1.0f;
    if (shot)
      driver.advance(st);

    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    if (shot && opt.mouse)
      io.MousePos = ImVec2((*opt.mouse)[0], (*opt.mouse)[1]);  // after the backend read the real pointer
    ImGui::NewFrame();
    draw_frame(st);
    ImGui::Render();
    glViewport(0, 0, fb_w, fb_h);
    const ImVec4 bg = ImGui::GetStyle().Colors[ImGuiCol_WindowBg];
    glClearColor(bg.x * 0.8f, bg.y * 0.8f, bg.z * 0.8f, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());

    if (!st.capture_path.empty()) {  // File > Export PNG: the panel's rectangle of the frame just drawn
      PanelRect r{0, 0, float(fb_w), float(fb_h)};
      if (!st.capture_panel.empty() && st.panel_rects.count(st.capture_panel))
        r = st.panel_rects[st.capture_panel];
      const int x = std::max(0, int(r.x)), y = std::max(0, int(r.y));
      const int w = std::min(fb_w - x, int(r.w)), h = std::min(fb_h - y, int(r.h));
      std::string err;
      if (write_png(st.capture_path, read_framebuffer(x, y, w, h, fb_h), w, h, &err))
        st.notify("Wrote " + st.capture_path);
      else
        st.notify(err, true);
      st.capture_path.clear();
      st.capture_panel.clear();
    }
    if (shot && driver.capture_due()) {
      rc = driver.finish(st, fb_w, fb_h);
      break;
    }
    glfwSwapBuffers(window);
    if (st.req_dirty) {
      worker->submit(st.req);
      st.req_dirty = false;
    }
  }
  if (st.persist)
    save_settings(st.settings);
  st.close_compare();  // joins the engine threads while GLFW (their wake-up call) is still alive
  worker.reset();
  st.worker = nullptr;
  st.head_tex = HeadTextures{};  // GL objects go before the context
  st.ov_tex = OverviewTexture{};
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return rc;
}
