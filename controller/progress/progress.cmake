# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# A job's progress: step reports, its summary, the bottleneck verdict,
# goodput, and the data ledger.
loom_library(loom_diagnosis SRCS ${_dir}/diagnosis.cc DEPS loom_proto absl::str_format)
loom_test(loom_diagnosis_test SRCS ${_dir}/diagnosis_test.cc DEPS loom_diagnosis)
loom_library(loom_goodput SRCS ${_dir}/goodput.cc DEPS loom_proto loom_metrics absl::time)
loom_test(loom_goodput_test SRCS ${_dir}/goodput_test.cc DEPS loom_goodput)
loom_library(loom_data_ledger SRCS ${_dir}/data_ledger.cc DEPS loom_proto)
loom_test(loom_data_ledger_test SRCS ${_dir}/data_ledger_test.cc DEPS loom_data_ledger)
loom_library(loom_job_progress SRCS ${_dir}/job_progress.cc
  DEPS loom_diagnosis loom_jobspec loom_proto absl::strings absl::str_format absl::time)
loom_test(loom_job_progress_test SRCS ${_dir}/job_progress_test.cc DEPS loom_job_progress)
loom_library(loom_step_reports SRCS ${_dir}/step_reports.cc
  DEPS loom_job_progress loom_job_table loom_worker_registry loom_checkpoint_catalog loom_event_hub
       loom_rollbacks loom_slow_rank_handler loom_recovery_metrics loom_recovery_policy
       absl::strings)
loom_test(loom_step_reports_test SRCS ${_dir}/step_reports_test.cc
  DEPS loom_step_reports ${LOOM_SUBSYSTEM_TEST_DEPS})
loom_library(loom_step_series SRCS ${_dir}/step_series.cc DEPS loom_grpc absl::strings)
loom_test(loom_step_series_test SRCS ${_dir}/step_series_test.cc DEPS loom_step_series)
loom_library(loom_step_series_index SRCS ${_dir}/step_series_index.cc
  DEPS loom_step_series loom_store)
loom_test(loom_step_series_index_test SRCS ${_dir}/step_series_index_test.cc
  DEPS loom_step_series_index)
loom_library(loom_series_warmer SRCS ${_dir}/series_warmer.cc DEPS loom_step_series_index loom_proto)
loom_test(loom_series_warmer_test SRCS ${_dir}/series_warmer_test.cc DEPS loom_series_warmer)
loom_library(loom_goodput_board SRCS ${_dir}/goodput_board.cc
  DEPS loom_goodput loom_job_state_machine loom_grpc)
loom_test(loom_goodput_board_test SRCS ${_dir}/goodput_board_test.cc DEPS loom_goodput_board)
