// The engine's on/off environment switches (README, "Choosing the attention kernel": the table lists every DS_*
// variable). Each is parsed here, once where it is read: 0 or 1, unset or empty for its default; any other value is
// a ds::Error naming the variable (a typo must not silently change what a measurement measures).
#pragma once

namespace ds {

bool env_switch(const char* name, bool fallback);

}  // namespace ds
