# Prometheus client (metrics.h) and its HTTP exposer (metrics_server.h).
loom_library(loom_metrics
  SRCS metrics.cc metrics_server.cc
  DEPS loom_common loom_civetweb absl::synchronization absl::strings
       absl::status absl::statusor absl::time absl::base)
loom_test(loom_metrics_test SRCS metrics_test.cc DEPS loom_metrics)
loom_test(loom_metrics_server_test SRCS metrics_server_test.cc DEPS loom_metrics)
