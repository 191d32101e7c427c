# Checkpoints of the engine (LibTorch): shards, restore, the choice at load,
# the asynchronous writer and its fence, the model's fingerprint, and the
# coordinator Train drives (part of loom_engine, engine.cmake). The files'
# layout and manifest are common/formats/ (loom_checkpoint_files).
loom_library(loom_checkpoint
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_restore.cc ${CMAKE_CURRENT_LIST_DIR}/checkpoint_format.cc
       ${CMAKE_CURRENT_LIST_DIR}/checkpoint_choice.cc
       ${CMAKE_CURRENT_LIST_DIR}/checkpoint_writer.cc ${CMAKE_CURRENT_LIST_DIR}/checkpoint_fence.cc
       ${CMAKE_CURRENT_LIST_DIR}/model_fingerprint.cc
  DEPS loom_checkpoint_files loom_crc32c loom_sha256 loom_file_util loom_prune_log loom_common
       yaml-cpp absl::synchronization absl::str_format ${TORCH_LIBRARIES})
loom_test(loom_checkpoint_test SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cc
          DEPS loom_checkpoint loom_engine loom_file_util)
loom_test(loom_checkpoint_choice_test SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_choice_test.cc
          DEPS loom_checkpoint loom_engine)
loom_test(loom_checkpoint_fence_test SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint_fence_test.cc
          DEPS loom_checkpoint)
