# The LibTorch training engine of one rank: model, optimizer, training loop.
loom_library(loom_engine SRCS gpt.cc optimizer.cc trainer.cc
             DEPS loom_data loom_sha256 loom_common ${TORCH_LIBRARIES})
loom_test(loom_gpt_test SRCS gpt_test.cc DEPS loom_engine)
loom_test(loom_optimizer_test SRCS optimizer_test.cc DEPS loom_engine)
loom_test(loom_trainer_test SRCS trainer_test.cc DEPS loom_engine TIMEOUT 600)
# The child that trainer_test.cc kills with SIGKILL mid-run (a separate
# executable, so that no process forks after LibTorch has started threads).
add_executable(loom_trainer_kill_helper trainer_kill_helper.cc)
target_link_libraries(loom_trainer_kill_helper PRIVATE loom_engine)
add_dependencies(loom_trainer_test loom_trainer_kill_helper)
target_compile_definitions(loom_trainer_test PRIVATE
  LOOM_TRAINER_KILL_HELPER="$<TARGET_FILE:loom_trainer_kill_helper>")

loom_library(loom_checkpoint_inspect SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_inspect.cc
  DEPS loom_sha256 loom_common ${TORCH_LIBRARIES})
