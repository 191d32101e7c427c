// libFuzzer target: the controller's queue file parser (--queues, re-read on
// SIGHUP), and resolving a job's queue and priority against what it parsed.
// Built only in the fuzz build.
#include <cstddef>
#include <cstdint>
#include <string>

#include "controller/scheduling/queue_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<loom::scheduling::QueueConfig> config = loom::scheduling::ParseQueueConfig(text);
  if (!config.ok()) return 0;
  for (const auto& queue : config->queues) {
    (void)config->ResolveQueue(queue.name).ok();
    (void)queue.Limit();
    (void)queue.AcceptsRole("user");
    (void)config->CohortCapacity(queue.cohort);
  }
  for (const auto& [name, value] : config->priority_classes) {
    (void)config->ResolvePriority(name).ok();
  }
  (void)config->ResolvePriority(text.substr(0, 16)).ok();
  return 0;
}
