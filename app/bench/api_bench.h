// diffscope-bench --only api: the two calls that bench/python_api_bench.py times through the Python module, timed
// here on a ds::Session directly, so that the script can set the Python overhead against them in one run:
//   lambda_logprobs  set_lambda_override(middle attention layer, v) + run() + next_token_logprobs(): the lambda
//                    change re-runs from that layer (v alternates between two values, so every call re-runs)
//   view_1024        backend().map_view of a 1024 x 1024 grid (max pool) of one head of that layer into a host
//                    ds::MapView (at 1024 tokens: the head's whole maps, exact), one MapView reused by every call:
//                    the engine's work without allocation, the floor the module's new View per call is held to
// Both sides warm up the same way and interleave the two calls in the same order; the JSON carries everything the
// script needs to repeat them (the model folder, the token ids, the layer, the head, the lambda values, the warm-up),
// every sample, and the minor page faults per call (an allocator effect, told apart from the calls' own cost).
// Plain C++ on the session API, so it builds with and without CUDA.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ds {

struct ApiBenchOptions {
  std::string backend = "cpu";  // "cpu" or "cuda"
  // Empty: on the CPU the demo model (assets/models/diffllama-demo, relative to the working directory: run from the
  // repository root), on CUDA a random checkpoint shaped like kajuma/DiffLlama-0.3B-handcut written to a temp folder
  // (synthetic_model.h), which the JSON names so that the script opens the same one.
  std::string model_dir;
  int64_t tokens = 1024;
  int repeat = 30;   // timed runs of each call; the median is reported
  int threads = 0;   // CPU threads (0: all cores)
};

// The folder the CUDA default writes its synthetic model to (the script deletes it afterwards unless told not to).
std::string api_bench_synthetic_dir();

// Prints a table and returns the "api" object of the --json output. Throws ds::Error.
nlohmann::json bench_api(const ApiBenchOptions& o);

}  // namespace ds
