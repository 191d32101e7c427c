# The controller, one folder per subsystem (each folder's .cmake names its
# libraries and tests); the job manager composes them.
loom_library(loom_store SRCS store/store.cc store/store_open.cc store/store_events.cc store/store_lease.cc store/store_logs.cc store/store_console.cc store/store_steps.cc store/migrations.cc store/sqlite_connection.cc
  store/postgres_connection.cc
  DEPS loom_proto loom_common SQLite::SQLite3 PostgreSQL::PostgreSQL absl::strings absl::time)
loom_test(loom_store_test SRCS store/store_test.cc DEPS loom_store loom_postgres_test_server)
loom_test(loom_store_lease_test SRCS store/store_lease_test.cc DEPS loom_store loom_postgres_test_server)
# A PostgreSQL server of a test's own (initdb into a temporary directory).
loom_library(loom_postgres_test_server SRCS store/postgres_test_server.cc
  DEPS loom_postgres_install PostgreSQL::PostgreSQL absl::strings absl::status absl::statusor)
loom_library(loom_leader SRCS leader/leader_lease.cc leader/catalog_mirror.cc
  DEPS loom_store absl::strings absl::str_format)
loom_test(loom_catalog_mirror_test SRCS leader/catalog_mirror_test.cc DEPS loom_leader)
loom_test(loom_leader_lease_test SRCS leader/leader_lease_test.cc
  DEPS loom_leader loom_postgres_test_server)

include(${CMAKE_CURRENT_SOURCE_DIR}/jobs/jobs.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/events/events.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/planner/planner.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/scheduling/scheduling.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/recovery/recovery.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/checkpoints/checkpoints.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/admission/admission.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/preemption/preemption.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/elastic/elastic.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/slow_ranks/slow_ranks.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/workers/workers.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/progress/progress.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/logs/logs.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/drains/drains.cmake)

# The composition: one lock over the subsystems, the API the services call.
loom_library(loom_job_manager SRCS job_manager.cc
  DEPS loom_event_hub loom_job_table loom_admission loom_preemptor loom_elastic
       loom_slow_rank_handler loom_failure_handler loom_rollbacks loom_workers loom_rank_commands
       loom_step_reports loom_drains
       loom_checkpoint_catalog loom_store loom_jobspec loom_common absl::strings
       absl::synchronization)
loom_test(loom_job_manager_test SRCS job_manager_test.cc DEPS loom_job_manager loom_goodput loom_metrics
          SQLite::SQLite3)

include(${CMAKE_CURRENT_SOURCE_DIR}/service/service.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/console/console.cmake)

add_executable(loom-controller controller_main.cc controller_flags.cc)
target_link_libraries(loom-controller PRIVATE loom_controller_service loom_console loom_goodput loom_health
  absl::flags absl::flags_parse absl::flags_usage absl::synchronization)
