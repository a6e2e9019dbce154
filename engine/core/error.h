// Errors a user can cause (files, prompts, memory, arguments) travel as ds::Error: one line, naming the file
// and the problem, with a hint where one helps. Programming errors are asserts, not Errors.
#pragma once
#include <stdexcept>
#include <string>

namespace ds {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Long work the user interrupted (a scan's prompt, a cancelled load): not a failure, nothing half-made is kept.
struct Cancelled : Error {
  Cancelled() : Error("cancelled") {}
};

// A forward stopped by its cancel predicate (ForwardRequest::cancel): layers below `layer` finished with the new
// inputs, `layer` and those above are stale.
struct ForwardCancelled : Cancelled {
  explicit ForwardCancelled(int l) : layer(l) {}
  int layer;
};

// "FILE: WHAT" -- the one-line form every file problem takes.
[[noreturn]] inline void fail_file(const std::string& file, const std::string& what) {
  throw Error(file + ": " + what);
}

}  // namespace ds
