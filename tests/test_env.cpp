// The DS_* on/off switches (engine/core/env.h): 0 and 1, the default when unset or empty, and any other value refused
// with the variable's name (DS_DECODE_GEMV and DS_SWIGLU_FUSED used to take anything that was not "0" as on).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "engine/core/env.h"
#include "engine/core/error.h"

TEST(EnvSwitch, ZeroOneDefaultAndRefusal) {
  const char* name = "DS_TEST_ENV_SWITCH";
  unsetenv(name);
  EXPECT_TRUE(ds::env_switch(name, true));
  EXPECT_FALSE(ds::env_switch(name, false));
  setenv(name, "", 1);
  EXPECT_TRUE(ds::env_switch(name, true));
  setenv(name, "0", 1);
  EXPECT_FALSE(ds::env_switch(name, true));
  setenv(name, "1", 1);
  EXPECT_TRUE(ds::env_switch(name, false));
  for (const char* bad : {"yes", "true", "2", "00", " 1", "off"}) {
    setenv(name, bad, 1);
    try {
      ds::env_switch(name, true);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(name) + "=" + bad), std::string::npos) << e.what();
    }
  }
  unsetenv(name);
}
