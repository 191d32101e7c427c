loom_library(loom_store SRCS store/store.cc store/store_events.cc store/store_lease.cc store/store_logs.cc store/migrations.cc store/sqlite_connection.cc
  store/postgres_connection.cc
  DEPS loom_proto loom_common SQLite::SQLite3 PostgreSQL::PostgreSQL absl::strings absl::time)
loom_library(loom_job_planning SRCS job_planning.cc DEPS loom_planner loom_scheduler loom_jobspec loom_grpc
  absl::strings absl::str_format)
loom_library(loom_scheduler SRCS scheduler.cc
  DEPS loom_planner loom_parallel_layout loom_grpc absl::strings absl::str_format)
loom_test(loom_scheduler_test SRCS scheduler_test.cc DEPS loom_scheduler)
loom_library(loom_diagnosis SRCS diagnosis.cc DEPS loom_proto absl::str_format)
loom_test(loom_diagnosis_test SRCS diagnosis_test.cc DEPS loom_diagnosis)
loom_library(loom_checkpoint_catalog SRCS checkpoint_catalog.cc checkpoint_verifier.cc
  DEPS loom_store loom_proto loom_prune_log loom_checkpoint_files absl::strings)
loom_test(loom_checkpoint_catalog_test SRCS checkpoint_catalog_test.cc
  DEPS loom_checkpoint_catalog loom_checkpoint loom_engine)
loom_library(loom_worker_registry SRCS worker_registry.cc
  DEPS loom_scheduler loom_common absl::strings absl::str_format)
loom_test(loom_worker_registry_test SRCS worker_registry_test.cc DEPS loom_worker_registry)
loom_library(loom_job_catalog SRCS job_catalog.cc
  DEPS loom_job_state_machine loom_store loom_proto loom_spike_detector loom_slow_rank_detector loom_common absl::strings absl::status)
loom_test(loom_job_catalog_test SRCS job_catalog_test.cc DEPS loom_job_catalog loom_store SQLite::SQLite3)
loom_library(loom_job_manager SRCS job_manager.cc job_scheduling.cc job_elastic.cc job_slow_ranks.cc elastic.cc job_progress.cc rank_reconciler.cc path_policy.cc
  DEPS loom_event_hub loom_job_catalog loom_worker_registry loom_recovery_policy loom_checkpoint_catalog loom_store loom_jobspec loom_spike_detector loom_job_planning loom_recovery_metrics
       loom_scheduler loom_scheduling
       loom_diagnosis loom_grpc
       loom_common absl::strings absl::str_format absl::synchronization)
loom_library(loom_access SRCS access.cc
  DEPS loom_grpc_util loom_file_util loom_sha256 absl::strings)
loom_test(loom_access_test SRCS access_test.cc DEPS loom_access loom_file_util)
loom_library(loom_log_store SRCS log_store.cc DEPS loom_store absl::strings absl::str_format absl::status absl::statusor)
loom_test(loom_log_store_test SRCS log_store_test.cc DEPS loom_log_store loom_postgres_test_server)
loom_library(loom_goodput SRCS goodput.cc DEPS loom_proto loom_metrics absl::time)
loom_test(loom_goodput_test SRCS goodput_test.cc DEPS loom_goodput)
loom_library(loom_data_ledger SRCS data_ledger.cc DEPS loom_proto)
loom_test(loom_data_ledger_test SRCS data_ledger_test.cc DEPS loom_data_ledger)
loom_library(loom_rank_logs SRCS rank_logs.cc DEPS loom_log_store loom_grpc absl::strings)
loom_test(loom_rank_logs_test SRCS rank_logs_test.cc DEPS loom_rank_logs)
loom_library(loom_leader SRCS leader/leader_lease.cc leader/catalog_mirror.cc
  DEPS loom_store absl::strings absl::str_format)
loom_test(loom_catalog_mirror_test SRCS leader/catalog_mirror_test.cc DEPS loom_leader)
loom_test(loom_leader_lease_test SRCS leader/leader_lease_test.cc
  DEPS loom_leader loom_postgres_test_server)
loom_library(loom_controller_service SRCS controller_service.cc
  DEPS loom_leader loom_access loom_job_manager loom_grpc loom_grpc_util loom_metrics loom_log_store
       loom_rank_logs)

add_executable(loom-controller controller_main.cc controller_flags.cc)
target_link_libraries(loom-controller PRIVATE loom_controller_service loom_goodput loom_health
  absl::flags absl::flags_parse absl::flags_usage absl::synchronization)

loom_test(loom_store_test SRCS store/store_test.cc DEPS loom_store loom_postgres_test_server)
loom_test(loom_job_manager_test SRCS job_manager_test.cc DEPS loom_job_manager loom_goodput loom_metrics
          SQLite::SQLite3)
loom_test(loom_path_policy_test SRCS path_policy_test.cc DEPS loom_job_manager)
loom_test(loom_job_progress_test SRCS job_progress_test.cc DEPS loom_job_manager)
loom_test(loom_rank_reconciler_test SRCS rank_reconciler_test.cc DEPS loom_job_manager)
loom_test(loom_elastic_test SRCS elastic_test.cc DEPS loom_job_manager)
loom_test(loom_job_planning_test SRCS job_planning_test.cc DEPS loom_job_planning loom_jobspec)
include(${CMAKE_CURRENT_SOURCE_DIR}/jobs/jobs.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/events/events.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/planner/planner.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/recovery/recovery.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/scheduling/scheduling.cmake)
# A PostgreSQL server of a test's own (initdb into a temporary directory).
loom_library(loom_postgres_test_server SRCS store/postgres_test_server.cc
  DEPS loom_postgres_install PostgreSQL::PostgreSQL absl::strings absl::status absl::statusor)
