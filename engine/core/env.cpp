#include "engine/core/env.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/core/error.h"

namespace ds {

bool env_switch(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  if (!std::strcmp(e, "0")) return false;
  if (!std::strcmp(e, "1")) return true;
  throw Error(std::string(name) + "=" + e + ": must be 0 or 1");
}

}  // namespace ds
