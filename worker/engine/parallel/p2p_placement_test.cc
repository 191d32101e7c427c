#include "worker/engine/parallel/p2p_placement.h"

#include <chrono>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "worker/engine/process_group_handle.h"

namespace loom::engine {
namespace {

TEST(P2pPlacementTest, NcclExchangesDeviceTensorsAndEverythingElseStagesThroughTheHost) {
  EXPECT_EQ(P2pPlacementFor("nccl"), P2pPlacement::kDevice);
  EXPECT_EQ(P2pPlacementFor("gloo"), P2pPlacement::kHost);
  EXPECT_EQ(P2pPlacementFor("undefined"), P2pPlacement::kHost);
  EXPECT_EQ(P2pPlacementFor(""), P2pPlacement::kHost);
}

TEST(P2pPlacementTest, ARealGlooGroupStagesThroughTheHost) {
  // The group the pipeline gets on CPU ranks, as process_groups.cc wraps it:
  // its backend name must read "gloo" on this LibTorch.
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(10));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = AsProcessGroup(store, c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options),
                              0, 1, /*nccl=*/false, std::chrono::seconds(10));
  EXPECT_EQ(group->getBackendName(), "gloo");
  EXPECT_EQ(P2pPlacementOf(*group), P2pPlacement::kHost);
}

TEST(P2pPlacementTest, StagingKeepsValuesAndPlacesBuffers) {
  const torch::Tensor x = torch::arange(12, torch::kFloat).view({3, 4}).t();  // not contiguous
  for (P2pPlacement placement : {P2pPlacement::kDevice, P2pPlacement::kHost}) {
    const torch::Tensor staged = StageForSend(x, placement);
    EXPECT_TRUE(staged.is_contiguous());
    EXPECT_TRUE(staged.device().is_cpu());  // a CPU rank's tensor is already on the host
    EXPECT_FALSE(staged.requires_grad());
    EXPECT_TRUE(torch::equal(staged, x));
    const torch::Tensor buffer = ReceiveBuffer({2, 5}, torch::kFloat, torch::kCPU, placement);
    EXPECT_EQ(buffer.sizes(), (std::vector<int64_t>{2, 5}));
    EXPECT_EQ(buffer.scalar_type(), torch::kFloat);
    EXPECT_TRUE(buffer.device().is_cpu());
  }
  // A buffer for a device placement is made on the device asked for; for
  // the host it is made on the host whatever the device.
  const torch::Tensor meta = ReceiveBuffer({2}, torch::kBFloat16, torch::Device(torch::kMeta),
                                           P2pPlacement::kDevice);
  EXPECT_TRUE(meta.is_meta());
  EXPECT_EQ(meta.scalar_type(), torch::kBFloat16);
  const torch::Tensor host = ReceiveBuffer({2}, torch::kFloat, torch::Device(torch::kMeta),
                                           P2pPlacement::kHost);
  EXPECT_TRUE(host.device().is_cpu());
}

TEST(P2pPlacementTest, CollectivesCopyOnlyWhatIsOnTheWrongSide) {
  // Deciding needs no GPU: a Device is a value.
  EXPECT_FALSE(NeedsCopy(P2pPlacement::kHost, torch::Device(torch::kCPU)));
  EXPECT_TRUE(NeedsCopy(P2pPlacement::kHost, torch::Device("cuda:1")));
  EXPECT_TRUE(NeedsCopy(P2pPlacement::kDevice, torch::Device(torch::kCPU)));
  EXPECT_FALSE(NeedsCopy(P2pPlacement::kDevice, torch::Device("cuda:0")));

  // A contiguous host fp32 tensor is used as it is, and finishing is a no-op.
  torch::Tensor flat = torch::arange(6, torch::kFloat);
  torch::Tensor staged = StageForCollective(flat, P2pPlacement::kHost);
  EXPECT_TRUE(staged.is_same(flat));
  staged.mul_(2);
  FinishStaged(flat, staged);
  EXPECT_TRUE(torch::equal(flat, torch::arange(6, torch::kFloat) * 2));

  // A view that is not contiguous is copied, and the result written back
  // into the view (so into its base).
  torch::Tensor base = torch::arange(12, torch::kFloat).view({3, 4});
  torch::Tensor view = base.t();
  torch::Tensor copy = StageForCollective(view, P2pPlacement::kHost);
  EXPECT_TRUE(copy.is_contiguous());
  EXPECT_FALSE(copy.is_same(view));
  EXPECT_TRUE(torch::equal(copy, view));
  copy.add_(100);
  FinishStaged(view, copy);
  EXPECT_EQ(base[2][3].item<float>(), 111.0f);
  EXPECT_TRUE(view.device().is_cpu());

  // bf16 is widened for the reduction and rounded back into the bf16 tensor.
  torch::Tensor half = torch::full({4}, 1.5, torch::kBFloat16);
  torch::Tensor wide = StageForCollective(half, P2pPlacement::kHost, /*widen=*/true);
  EXPECT_EQ(wide.scalar_type(), torch::kFloat);
  wide.add_(1);
  FinishStaged(half, wide);
  EXPECT_EQ(half.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(half[3].item<float>(), 2.5f);
  // Without widening a bf16 host tensor is used as it is.
  EXPECT_TRUE(StageForCollective(half, P2pPlacement::kHost).is_same(half));
}

}  // namespace
}  // namespace loom::engine
