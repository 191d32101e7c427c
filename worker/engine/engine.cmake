# The LibTorch training engine of one rank: model, optimizer, training loop.
loom_library(loom_engine SRCS gpt.cc optimizer.cc trainer.cc
             DEPS loom_data loom_sha256 loom_common ${TORCH_LIBRARIES})
loom_test(loom_gpt_test SRCS gpt_test.cc DEPS loom_engine)
loom_test(loom_optimizer_test SRCS optimizer_test.cc DEPS loom_engine)
loom_test(loom_trainer_test SRCS trainer_test.cc DEPS loom_engine TIMEOUT 600)
