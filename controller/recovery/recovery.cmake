# Included from controller/CMakeLists.txt: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
loom_library(loom_spike_detector SRCS ${_dir}/spike_detector.cc DEPS absl::str_format)
loom_test(loom_spike_detector_test SRCS ${_dir}/spike_detector_test.cc DEPS loom_spike_detector)
