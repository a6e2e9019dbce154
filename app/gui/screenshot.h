// --screenshot mode: wait until the engine has finished everything the request asks for (model loaded, run,
// maps, overview, sweep) and the textures are built, let the layout settle for a few frames, then capture the
// whole window to PNG, write the --state-json sidecar and exit. Non-zero exit code when an error was shown or
// the run never completed.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "app_state.h"
#include "cli_options.h"

namespace ds::gui {

class ScreenshotDriver {
 public:
  explicit ScreenshotDriver(const CliOptions& opt);
  // Once per frame, after the snapshot was absorbed and before drawing.
  void advance(AppState& st);
  bool capture_due() const { return phase_ == Phase::Capture; }
  // After the frame was rendered: write the PNG and the sidecar; returns the process exit code.
  int finish(AppState& st, int fb_w, int fb_h);
  bool waiting_on_engine() const { return phase_ == Phase::Wait; }

 private:
  enum class Phase { Wait, Replay, Settle, Capture };
  bool ready(const AppState& st) const;
  void replay_frame(AppState& st);
  void write_replay_log() const;
  CliOptions opt_;
  Phase phase_ = Phase::Wait;
  bool opened_after_ = false;
  int settle_frames_ = 0;
  double start_ = 0;
  // --replay-lambda: the values set so far with their times, one log line per frame.
  struct ReplayFrame {
    double t_ms, frame_ms, lambda_set, lambda_shown, latency_ms;
    double diff_lambda, diff_latency_ms;  // the lambda of the difference map on screen (the head view), its latency
  };
  std::vector<std::pair<double, double>> replay_set_;  // (lambda, time set in ms)
  std::vector<ReplayFrame> replay_log_;
  double last_frame_ms_ = 0;
  size_t replay_shown_ = 0;  // index into replay_set_ of the newest value the engine has shown
  size_t diff_shown_ = 0;    // the same for the head view's difference map
};

}  // namespace ds::gui
