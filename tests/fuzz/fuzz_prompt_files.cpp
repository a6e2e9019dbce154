// Fuzz the prompt and token-ids file readers the CLI and the GUI share (engine/core/input_limits.h) and the ids parser.
#include <string>

#include "app/cli/run_args.h"
#include "engine/core/error.h"
#include "engine/core/input_limits.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsfuzz::MemFile f(data, size);
  try {
    (void)ds::read_prompt_file(f.path());
    (void)ds::cli::parse_id_list(ds::read_token_ids_file(f.path()), "ids.txt");
  } catch (const ds::Error&) {
  } catch (const ds::cli::ArgError&) {
  }
  return 0;
}
