#include "worker/engine/parallel/nccl_errors.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "<unset>" : value;
}

TEST(NcclErrorsTest, BlockingWaitWithoutTeardownOrMonitorUnderEveryName) {
  // A user's contrary setting is overwritten: the failure contract needs it.
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "0", 1);
  ::setenv("NCCL_ASYNC_ERROR_HANDLING", "3", 1);
  ConfigureNcclErrorHandling();
  EXPECT_EQ(Env("TORCH_NCCL_BLOCKING_WAIT"), "1");
  EXPECT_EQ(Env("NCCL_BLOCKING_WAIT"), "1");
  EXPECT_EQ(Env("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
  EXPECT_EQ(Env("NCCL_ASYNC_ERROR_HANDLING"), "0");
  EXPECT_EQ(Env("TORCH_NCCL_ENABLE_MONITORING"), "0");
  // Idempotent.
  ConfigureNcclErrorHandling();
  EXPECT_EQ(Env("TORCH_NCCL_BLOCKING_WAIT"), "1");
  EXPECT_EQ(NcclErrorHandlingEnvironment().size(), 5u);
}

}  // namespace
}  // namespace loom::engine
