// train::fault_injector_from_env: which rank it arms, when it stays off, and its malformed specs.
// (What an armed injector does, a worker killing itself mid-run, the launch tests show.)
#include "hpm/train/restart_callbacks.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace hpm::train {
namespace {

struct Env {
  Env(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~Env() { ::unsetenv(name_); }
  const char* name_;
};

TEST(FaultInjector, ArmsOnlyTheNamedRankInTheFirstAttempt) {
  ::unsetenv("HPM_FAULT_AT_STEP");
  EXPECT_EQ(fault_injector_from_env(0), nullptr);
  Env spec("HPM_FAULT_AT_STEP", "1:5");
  EXPECT_EQ(fault_injector_from_env(0), nullptr);
  EXPECT_NE(fault_injector_from_env(1), nullptr);
  {
    Env restart("HPM_RESTART", "1");
    EXPECT_EQ(fault_injector_from_env(1), nullptr) << "a restarted group runs through";
  }
  Env term("HPM_FAULT_AT_STEP", "1:5:TERM");
  EXPECT_NE(fault_injector_from_env(1), nullptr);
  for (const char* bad : {"15", "1:5:HUP"}) {
    Env malformed("HPM_FAULT_AT_STEP", bad);
    EXPECT_THROW(fault_injector_from_env(1), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace hpm::train
