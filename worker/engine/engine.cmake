# The LibTorch training engine of one rank: model, optimizer, training loop.
loom_library(loom_engine SRCS gpt.cc optimizer.cc trainer.cc resume.cc checkpoint/checkpoint_coordinator.cc
                              checkpoint/snapshot_keeper.cc
                              replicated_engine.cc gradient_averager.cc block_probe.cc
                              activation_checkpoint.cc autocast.cc
                              cpu_memory_meter.cc loss_scaler.cc host_allocator.cc openmp_wait.cc
                              sampler.cc
             DEPS loom_proto loom_checkpoint loom_data loom_fused_adamw_torch
                  loom_fused_loss loom_causal_attention loom_gelu loom_rms_norm loom_swiglu loom_device_memory loom_sha256
                  loom_common loom_model_shape ${TORCH_LIBRARIES})
# LibTorch with CUDA (its torch_cuda target; never Debian's CPU build) defines
# USE_C10D_NCCL, and parallel/process_groups.cc then includes ProcessGroupNCCL.hpp, which
# includes <nccl.h>. PyTorch's wheels do not ship it under torch/include: it
# is in the nvidia-nccl wheel beside torch (site-packages/nvidia/...), or
# libnccl-dev, or NCCL_INCLUDE_DIR / NCCL_ROOT.
if(TARGET torch_cuda)
  get_filename_component(LOOM_TORCH_SITE_PACKAGES "${Torch_DIR}/../../../.." ABSOLUTE)
  find_path(LOOM_NCCL_INCLUDE_DIR nccl.h
            HINTS $ENV{NCCL_INCLUDE_DIR} $ENV{NCCL_ROOT}/include
                  ${LOOM_TORCH_SITE_PACKAGES}/nvidia/nccl/include
                  ${LOOM_TORCH_SITE_PACKAGES}/nvidia/cu13/include ${CUDAToolkit_INCLUDE_DIRS})
  if(LOOM_NCCL_INCLUDE_DIR)
    target_include_directories(loom_engine PRIVATE ${LOOM_NCCL_INCLUDE_DIR})
  else()
    message(WARNING "Loom: LibTorch has CUDA but nccl.h was not found (set NCCL_INCLUDE_DIR); "
                    "parallel/process_groups.cc will not compile with USE_C10D_NCCL")
  endif()
endif()
loom_test(loom_gpt_test SRCS gpt_test.cc DEPS loom_engine)
loom_test(loom_llama_test SRCS llama_test.cc DEPS loom_engine)
loom_test(loom_host_allocator_test SRCS host_allocator_test.cc DEPS loom_engine)
# ReexecWithShortOpenMpSpin (openmp_wait.h), checked in a helper process
# whose OpenMP runtime reports the spin count it uses.
add_executable(loom_openmp_wait_helper openmp_wait_helper.cc)
target_link_libraries(loom_openmp_wait_helper PRIVATE loom_engine OpenMP::OpenMP_CXX)
loom_test(loom_openmp_wait_test SRCS openmp_wait_test.cc DEPS loom_engine absl::strings)
add_dependencies(loom_openmp_wait_test loom_openmp_wait_helper)
target_compile_definitions(loom_openmp_wait_test PRIVATE
  LOOM_OPENMP_WAIT_HELPER="$<TARGET_FILE:loom_openmp_wait_helper>")
loom_test(loom_activation_checkpoint_test SRCS activation_checkpoint_test.cc DEPS loom_engine)
loom_test(loom_loss_scaler_test SRCS loss_scaler_test.cc DEPS loom_engine)
loom_test(loom_precision_test SRCS precision_test.cc DEPS loom_engine TIMEOUT 600)
loom_test(loom_optimizer_test SRCS optimizer_test.cc DEPS loom_engine)
loom_test(loom_gradient_averager_test SRCS gradient_averager_test.cc DEPS loom_engine)
# In-process ranks: see loom_trainer_test below.
set_tests_properties(loom_gradient_averager_test PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
loom_test(loom_trainer_test SRCS trainer_test.cc DEPS loom_engine loom_checkpoint_inspect
          TIMEOUT 600)
# In-process ranks (threads) call Debian's OpenMP OpenBLAS concurrently,
# which is only deterministic with one OpenMP thread process-wide: identical
# 2-rank runs differed by up to 2e-6 in half the runs otherwise
# (trainer_test.cc, RunRanks).
set_tests_properties(loom_trainer_test PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
loom_test(loom_resume_test SRCS resume_test.cc DEPS loom_engine TIMEOUT 300)
set_tests_properties(loom_resume_test PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
# The child that trainer_test.cc kills with SIGKILL mid-run or mid-save (a
# separate executable, so that no process forks after LibTorch has started
# threads).
add_executable(loom_trainer_kill_helper trainer_kill_helper.cc)
target_link_libraries(loom_trainer_kill_helper PRIVATE loom_engine)
add_dependencies(loom_trainer_test loom_trainer_kill_helper)
target_compile_definitions(loom_trainer_test PRIVATE
  LOOM_TRAINER_KILL_HELPER="$<TARGET_FILE:loom_trainer_kill_helper>")

loom_library(loom_checkpoint_inspect SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoint/checkpoint_inspect.cc
  ${CMAKE_CURRENT_LIST_DIR}/hf_export.cc
  DEPS loom_engine loom_checkpoint loom_file_util loom_sha256 loom_common ${TORCH_LIBRARIES})
# The Hugging Face export against an independent Python reader
# (tests/export/hf_logits.py, Debian's python3-torch).
loom_test(loom_hf_export_test SRCS hf_export_test.cc DEPS loom_checkpoint_inspect)
target_compile_definitions(loom_hf_export_test PRIVATE LOOM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
