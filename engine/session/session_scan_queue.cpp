// The replicas' prompt order (session_scan_queue.h).
#include "engine/session/session_scan_queue.h"

#include <algorithm>
#include <utility>

namespace ds::scan {

PromptQueue::PromptQueue(size_t count, std::function<int64_t(size_t)> group, size_t lookahead)
    : count_(count), lookahead_(lookahead < 1 ? 1 : lookahead), group_(std::move(group)), taken_(count, 0),
      groups_(count, -2) {}

int64_t PromptQueue::group_of(size_t i) {
  if (groups_[i] == -2) groups_[i] = group_ ? std::max<int64_t>(-1, group_(i)) : -1;
  return groups_[i];
}

std::optional<size_t> PromptQueue::take() {
  while (first_ < count_ && taken_[first_]) ++first_;
  if (first_ == count_) return std::nullopt;
  size_t pick = first_;
  size_t looked = 0;
  for (size_t j = first_; j < count_ && looked < lookahead_; ++j) {
    if (taken_[j]) continue;
    ++looked;
    const int64_t g = group_of(j);
    const auto b = g < 0 ? buckets_.end() : buckets_.find(g);
    if (b == buckets_.end() || b->second == Bucket::Warm) {
      pick = j;
      break;
    }
  }
  const int64_t g = group_of(pick);
  if (g >= 0) buckets_.try_emplace(g, Bucket::Starting);
  taken_[pick] = 1;
  ++taken_count_;
  return pick;
}

void PromptQueue::done(size_t i) {
  if (i >= count_ || groups_[i] < 0) return;
  buckets_[groups_[i]] = Bucket::Warm;
}

}  // namespace ds::scan
