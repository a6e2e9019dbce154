// The order in which the replicas of a scan over several devices (session_scan_replicas.h) take their prompts.
//
// Each device's backend times its GEMMs the first time it meets a length bucket (core/length_bucket.h), and identical
// devices share what any of them timed. Handed out strictly in input order, the replicas of a 4-GPU scan start on
// prompts of the same buckets at the same time, and each GPU may time most buckets itself (a timing is shared only
// once it is done). This queue keeps input order, except that a prompt whose bucket another
// replica has started and not yet finished is passed over for the next one (within a look-ahead) whose bucket is
// either already timed or not yet started: the buckets' timings spread over the devices instead of being repeated on
// each. Which replica scans a prompt never changes its result, only when it finishes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace ds::scan {

class PromptQueue {
 public:
  // count prompts; group(i): prompt i's length bucket (< 0: none, never passed over), asked once per prompt, when it
  // is first considered. Not thread-safe: the scan calls it under its lock.
  PromptQueue(size_t count, std::function<int64_t(size_t)> group, size_t lookahead = 64);
  // The next prompt to scan, or nullopt when every prompt has been taken.
  std::optional<size_t> take();
  // Prompt i (taken) has finished, scanned or skipped: its bucket counts as timed from now on.
  void done(size_t i);
  size_t taken() const { return taken_count_; }

 private:
  int64_t group_of(size_t i);
  enum class Bucket : uint8_t { Starting, Warm };
  size_t count_, lookahead_, first_ = 0, taken_count_ = 0;
  std::function<int64_t(size_t)> group_;
  std::vector<uint8_t> taken_;
  std::vector<int64_t> groups_;  // -2: not asked yet
  std::map<int64_t, Bucket> buckets_;
};

}  // namespace ds::scan
