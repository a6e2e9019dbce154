// Fuzz the corpus reader of diffscope-scan and the GUI's Corpus panel: lines of JSON (nesting limited, lines bounded),
// answer spans, targets and tags. A bad line must become a skipped line, never a crash.
#include <string>

#include "engine/core/error.h"
#include "engine/session/session_scan.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsfuzz::MemFile f(data, size);
  try {
    const ds::scan::Corpus c = ds::scan::read_corpus(f.path());
    (void)c.prompts.size();
  } catch (const ds::Error&) {
  }
  return 0;
}
