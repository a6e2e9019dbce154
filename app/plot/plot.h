// The figure of a corpus scan: one PNG drawn with cairo from the report that engine/session/session_scan.h's make_report
// makes (diffscope-scan --plot, and the GUI's Corpus panel saves the same picture). One or two runs (the report's
// top-level run and its "compare" run), side by side in every panel, each in its own colour:
//   a  attention on the answer span vs on the context (the noise) vs on the sink, averaged over layers, heads and
//      prompts, as bars in the style of Figure 1 of the Differential Transformer paper (Ye et al. 2024): the
//      "*_diff" fractions (D = A1 - lambda*A2) for a differential run, the "*1" fractions (softmax) for a plain one;
//   b  the answer mass of every layer x head (answer_diff / answer1) as heatmaps on one shared colour scale, with
//      each layer's mean beside them;
//   c  when the report has "groups": the answer mass and the accuracy against "depth" and against "length".
// Null (NaN) values are left out: grey cells, bars marked n/a, gaps in the lines.
#pragma once
#include <string>

#include "engine/session/session_scan.h"

namespace ds::scan {

// Draws the report of a corpus scan (engine/session/session_scan.h's make_report) as one PNG, about 1600 px wide. The file
// is written atomically (a temporary file renamed over it). Throws ds::Error (engine/core/error.h) naming the file for a
// write failure.
void write_plot_png(const Report& report, const std::string& path);

}  // namespace ds::scan
