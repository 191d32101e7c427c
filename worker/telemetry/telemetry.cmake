# Included from worker/CMakeLists.txt.
set(_tdir ${CMAKE_CURRENT_LIST_DIR})
# NVML is loaded with dlopen at run time: no NVML headers or library at build time.
loom_library(loom_nvml SRCS ${_tdir}/nvml.cc
  DEPS absl::status absl::statusor absl::strings ${CMAKE_DL_LIBS})
loom_library(loom_telemetry SRCS ${_tdir}/telemetry.cc ${_tdir}/peak_flops.cc
  DEPS loom_nvml loom_model_shape absl::strings absl::str_format)
loom_library(loom_gemm_calibration SRCS ${_tdir}/gemm_calibration.cc DEPS ${TORCH_LIBRARIES})

# Tests only: a stand-in libnvidia-ml.so.1 with deterministic answers, which
# the tests dlopen by path so the real dlopen/dlsym code runs without a GPU.
add_library(loom_fake_nvml SHARED ${_tdir}/nvml_fake_lib.cc)
set(_fake_nvml_def "LOOM_FAKE_NVML_PATH=\"$<TARGET_FILE:loom_fake_nvml>\"")

loom_test(loom_nvml_test SRCS ${_tdir}/nvml_test.cc DEPS loom_nvml)
target_compile_definitions(loom_nvml_test PRIVATE ${_fake_nvml_def})
add_dependencies(loom_nvml_test loom_fake_nvml)

loom_test(loom_telemetry_test SRCS ${_tdir}/telemetry_test.cc DEPS loom_telemetry)
target_compile_definitions(loom_telemetry_test PRIVATE ${_fake_nvml_def})
add_dependencies(loom_telemetry_test loom_fake_nvml)

loom_test(loom_peak_flops_test SRCS ${_tdir}/peak_flops_test.cc DEPS loom_telemetry)
