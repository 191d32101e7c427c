add_library(loom_test_util STATIC test_util.cc netns_lab.cc cpu_quota.cc)
target_link_libraries(loom_test_util PUBLIC absl::status absl::statusor absl::strings)
target_include_directories(loom_test_util PUBLIC ${PROJECT_SOURCE_DIR})

add_executable(loom_cluster_test cluster_test.cc)
target_compile_definitions(loom_cluster_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(loom_cluster_test PRIVATE loom_test_util loom_local_cluster loom_grpc loom_data
  loom_file_util gRPC::grpc++ absl::strings GTest::gtest GTest::gmock GTest::gtest_main)
# The cluster tests drive these binaries.
add_dependencies(loom_cluster_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
# One ctest entry per test case, so ctest -j runs them side by side. The two
# longest scenarios (about 220 s alone, two 700-step jobs or a shrink and a
# grow) get more room than the rest: beside another heavy test under
# ctest -j2 they have run past 300 s.
set(LOOM_LONG_CLUSTER_TESTS
  "ClusterTest.SlowPipelineStageIsReplannedWithFewerBlocks:ClusterTest.ElasticJobShrinksWhenAWorkerIsLostAndGrowsBackWhenItReturns")
gtest_discover_tests(loom_cluster_test TEST_FILTER "-${LOOM_LONG_CLUSTER_TESTS}"
                     PROPERTIES TIMEOUT 300 LABELS integration)
gtest_discover_tests(loom_cluster_test TEST_FILTER "${LOOM_LONG_CLUSTER_TESTS}"
                     PROPERTIES TIMEOUT 600 LABELS integration)

# Twenty node notices (SIGTERM, a notice file, a metadata endpoint the test
# serves with cpp-httplib) at random steps, on a local cluster.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
add_executable(loom_notice_test notice_test.cc)
target_compile_definitions(loom_notice_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(loom_notice_test PRIVATE loom_test_util loom_local_cluster loom_grpc loom_data
  loom_file_util PkgConfig::CPP_HTTPLIB gRPC::grpc++ absl::strings GTest::gtest GTest::gmock
  GTest::gtest_main)
add_dependencies(loom_notice_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
gtest_discover_tests(loom_notice_test PROPERTIES TIMEOUT 600 LABELS integration)

# In-memory snapshots: a node lost mid-run, on a local cluster.
add_executable(loom_snapshot_test snapshot_test.cc)
target_compile_definitions(loom_snapshot_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(loom_snapshot_test PRIVATE loom_test_util loom_local_cluster loom_grpc loom_data
  loom_file_util gRPC::grpc++ absl::strings GTest::gtest GTest::gmock GTest::gtest_main)
add_dependencies(loom_snapshot_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
gtest_discover_tests(loom_snapshot_test PROPERTIES TIMEOUT 600 LABELS integration)

# Checkpoints in an object store (Ceph's RADOS Gateway on loopback, from
# scripts/install-deploy-deps.sh), on a local cluster.
add_executable(loom_remote_tier_test remote_tier_test.cc)
target_compile_definitions(loom_remote_tier_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(loom_remote_tier_test PRIVATE loom_test_util loom_local_cluster loom_grpc loom_data
  loom_file_util loom_s3_test_server gRPC::grpc++ absl::strings GTest::gtest GTest::gmock
  GTest::gtest_main)
add_dependencies(loom_remote_tier_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
gtest_discover_tests(loom_remote_tier_test PROPERTIES TIMEOUT 300 LABELS integration)

# The cluster scenarios whose subject is what the controller keeps in its
# store, again with the controller on PostgreSQL (`local up --store
# postgres`): jobs and their transitions across controller restarts, the
# checkpoint catalog, worker leases and fencing, cordons, preemption and
# rollback records, stored plans. Scenarios about the engine, the network or
# the planner (tensor/pipeline layouts, elastic resizing, partitions, Llama,
# TLS, spec validation) run on SQLite only: the store is not what they test.
set(LOOM_STORE_CLUSTER_TESTS
  "ClusterTest.TrainsDataParallelJobToSuccess"
  "ClusterTest.PreemptedJobSavesResumesAndMatchesItsUninterruptedRunBitwise"
  "ClusterTest.CancelledJobEndsCancelledAndItsRanksExit"
  "ClusterTest.KilledWorkerFailsItsJobWithAReason"
  "ClusterTest.KilledWorkerJobRestartsFromCheckpointAndSucceeds"
  "ClusterTest.CorruptCheckpointIsReportedVerifiedAndSkipped"
  "ClusterTest.ControllerKilledMidJobAndRestartedWithinTheGraceLosesNothing"
  "ClusterTest.ControllerDownPastTheGraceRestartsTheJobOnce"
  "ClusterTest.HostFrozenPastTheLeaseResumesWithoutARestart"
  "ClusterTest.FrozenAttemptThawedAfterARestartIsFencedOffTheCheckpointDirectory"
  "ClusterTest.SlowRankIsNamedItsNodeCordonedAndTheElasticJobShrinksAwayFromIt"
  "ClusterTest.LossSpikeRollsBackSkipsAndMatchesAReplay"
  "ClusterTest.PlansOnTheLiveClusterAndStoresTheAutoPlan"
  "ClusterTest.OperatorRollbackResumesSkipsAndSucceeds")
list(JOIN LOOM_STORE_CLUSTER_TESTS ":" LOOM_STORE_CLUSTER_FILTER)
add_executable(loom_cluster_pg_test cluster_test.cc)
target_compile_definitions(loom_cluster_pg_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}" LOOM_CLUSTER_TESTS_ON_POSTGRES=1)
target_link_libraries(loom_cluster_pg_test PRIVATE loom_test_util loom_local_cluster loom_grpc loom_data
  loom_file_util gRPC::grpc++ absl::strings GTest::gtest GTest::gmock GTest::gtest_main)
add_dependencies(loom_cluster_pg_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
gtest_discover_tests(loom_cluster_pg_test TEST_PREFIX "postgres/"
                     TEST_FILTER "${LOOM_STORE_CLUSTER_FILTER}"
                     PROPERTIES TIMEOUT 300 LABELS integration)

# Loom Console in Debian's Chromium, driven by playwright-core (installed by
# scripts/install-deploy-deps.sh), against a local cluster.
add_executable(loom_console_browser_test console_browser_test.cc)
target_compile_definitions(loom_console_browser_test PRIVATE
  LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}" LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(loom_console_browser_test PRIVATE loom_test_util loom_local_cluster loom_grpc
  loom_data loom_file_util gRPC::grpc++ absl::strings GTest::gtest GTest::gmock GTest::gtest_main)
add_dependencies(loom_console_browser_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
gtest_discover_tests(loom_console_browser_test PROPERTIES TIMEOUT 600 LABELS integration)

# Active/standby controllers over PostgreSQL: `local up --ha`.
add_executable(loom_ha_test ha_test.cc)
target_compile_definitions(loom_ha_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(loom_ha_test PRIVATE loom_test_util loom_local_cluster loom_grpc loom_data
  protobuf::libprotobuf
  loom_file_util gRPC::grpc++ absl::strings GTest::gtest GTest::gmock GTest::gtest_main)
add_dependencies(loom_ha_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
gtest_discover_tests(loom_ha_test PROPERTIES TIMEOUT 300 LABELS integration)

# The Jepsen-style run (tests/failover_cluster.h), also `./bench/run.sh failover`.
add_library(loom_failover_cluster STATIC failover_cluster.cc)
target_link_libraries(loom_failover_cluster PUBLIC loom_test_util loom_local_cluster loom_proto loom_grpc
  loom_file_util absl::strings absl::str_format)
add_executable(loom_failover_test failover_test.cc)
target_compile_definitions(loom_failover_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
target_link_libraries(loom_failover_test PRIVATE loom_failover_cluster GTest::gtest GTest::gmock
  GTest::gtest_main)
add_dependencies(loom_failover_test loomctl loom-controller loom-worker loom-rank loom-ckpt)
gtest_discover_tests(loom_failover_test PROPERTIES TIMEOUT 600 LABELS integration)

# The role test: every RPC by every kind of caller, on a real
# controller.
# A real controller with TLS, a users file and a workers' token, for the
# tests that call it as different callers.
add_library(loom_tls_controller STATIC tls_controller.cc)
target_link_libraries(loom_tls_controller PUBLIC loom_test_util loom_local_cluster loom_file_util
  absl::status absl::strings)
add_executable(loom_rpc_access_test rpc_access_test.cc)
target_compile_definitions(loom_rpc_access_test PRIVATE
  LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
target_link_libraries(loom_rpc_access_test PRIVATE loom_tls_controller loom_test_util loom_local_cluster loom_access
  loom_grpc loom_grpc_util loom_file_util gRPC::grpc++ absl::strings GTest::gtest GTest::gmock
  GTest::gtest_main)
add_dependencies(loom_rpc_access_test loom-controller)
gtest_discover_tests(loom_rpc_access_test PROPERTIES TIMEOUT 120 LABELS integration)

# The console's JSON API over HTTPS on a real controller.
add_executable(loom_console_api_test console_api_test.cc)
target_compile_definitions(loom_console_api_test PRIVATE
  LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
target_link_libraries(loom_console_api_test PRIVATE loom_tls_controller loom_test_util loom_local_cluster loom_access
  loom_grpc loom_grpc_util loom_file_util loom_jobspec gRPC::grpc++ absl::strings GTest::gtest
  GTest::gmock GTest::gtest_main)
add_dependencies(loom_console_api_test loom-controller)
gtest_discover_tests(loom_console_api_test PROPERTIES TIMEOUT 120 LABELS integration)

add_executable(loom_cli_test cli_test.cc)
target_compile_definitions(loom_cli_test PRIVATE LOOM_BIN_DIR="${CMAKE_RUNTIME_OUTPUT_DIRECTORY}"
  LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(loom_cli_test PRIVATE loom_test_util loom_cli_help protobuf::libprotobuf
  absl::strings GTest::gtest GTest::gmock GTest::gtest_main)
add_dependencies(loom_cli_test loomctl)
gtest_discover_tests(loom_cli_test PROPERTIES TIMEOUT 120 LABELS integration)

loom_test(loom_dashboard_test SRCS dashboard_test.cc DEPS loom_file_util protobuf::libprotobuf)
target_compile_definitions(loom_dashboard_test PRIVATE LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# Every libFuzzer target (tests/fuzz.cmake) for a few seconds from its seeds,
# under ASan + UBSan: builds them with clang-14 in a build of its own.
add_test(NAME loom_fuzz_smoke
         COMMAND ${CMAKE_COMMAND} -E env FUZZ_BUILD_DIR=${PROJECT_BINARY_DIR}/fuzz
                 ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh --smoke)
set_tests_properties(loom_fuzz_smoke PROPERTIES LABELS "fuzz;heavy" TIMEOUT 2400)

# The job-spec reference (docs/jobspec.md) against proto/loom/v1/job.proto,
# and every relative link in README.md and docs/ (standard-library Python).
add_test(NAME loom_docs_jobspec_test
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/docs/check_jobspec_doc.py
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(loom_docs_jobspec_test PROPERTIES LABELS docs TIMEOUT 60)

# No shell pipeline into a reader that stops early (grep -q, head): under
# pipefail the writer's SIGPIPE fails it at random (standard-library Python).
add_test(NAME loom_shell_pipes_test
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/lint/check_shell_pipes.py
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(loom_shell_pipes_test PROPERTIES LABELS lint TIMEOUT 60)

# The defaults blocks of docs/*.md against the defaults the code applies.
loom_test(loom_doc_defaults_test SRCS docs/doc_defaults_test.cc
          DEPS loom_jobspec loom_recovery_policy yaml-cpp absl::strings LABELS docs)
target_compile_definitions(loom_doc_defaults_test PRIVATE LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# The supported LibTorch versions, checked at configure time (CMakeLists.txt).
add_test(NAME loom_torch_version_test
         COMMAND ${PROJECT_SOURCE_DIR}/tests/cmake/torch_version_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(loom_torch_version_test PROPERTIES TIMEOUT 300)

# The GPU check's rehearsal (scripts/gpu-run.sh --rehearse): the standalone
# GPU build (bench/gpu/) against Debian's LibTorch in a build dir of its
# own, then every check. tests/gpu/rehearsal_test.sh asserts that the parts
# that need no GPU pass and that every GPU check skips with exit 77, so a
# green run here is never mistaken for a GPU pass.
add_test(NAME loom_gpu_rehearsal
         COMMAND ${PROJECT_SOURCE_DIR}/tests/gpu/rehearsal_test.sh ${PROJECT_SOURCE_DIR}
                 ${PROJECT_BINARY_DIR}/gpu-rehearsal)
set_tests_properties(loom_gpu_rehearsal PROPERTIES LABELS "gpu;heavy" TIMEOUT 3600)
