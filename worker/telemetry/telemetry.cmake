# Included from worker/CMakeLists.txt.
set(_tdir ${CMAKE_CURRENT_LIST_DIR})
loom_library(loom_telemetry SRCS ${_tdir}/telemetry.cc)
loom_library(loom_gemm_calibration SRCS ${_tdir}/gemm_calibration.cc DEPS ${TORCH_LIBRARIES})
loom_test(loom_telemetry_test SRCS ${_tdir}/telemetry_test.cc DEPS loom_telemetry)
