#include "controller/planner/iron_law.h"

#include "gtest/gtest.h"

namespace loom::planner {
namespace {

// The chapter's worked examples, exact within 1%.
TEST(IronLawTest, Llama2_70BOnTwoTrillionTokens) {
  const double flops = SixPD(70e9, 2e12);
  EXPECT_NEAR(flops, 8.4e23, 0.01 * 8.4e23);
  IronLawInputs in;
  in.total_flops = flops;
  in.peak_flops_per_device = 989e12;  // H100 bf16 dense
  in.utilization = 0.5;
  in.devices = 1024;
  in.price_per_device_hour_usd = 3.0;
  const IronLawEstimate est = EstimateIronLaw(in);
  EXPECT_NEAR(est.device_seconds, 1.70e9, 0.01 * 1.70e9);
  EXPECT_NEAR(est.train_days(), 19.2, 0.01 * 19.2);
  EXPECT_NEAR(est.cost_usd, 1.42e6, 0.01 * 1.42e6);
}

TEST(IronLawTest, EnergyOfSevenBOnOneTrillionTokens) {
  IronLawInputs in;
  in.total_flops = 4.2e22;
  in.peak_flops_per_device = 312e12;  // A100 bf16
  in.utilization = 0.5;               // 156 TFLOP/s sustained
  in.devices = 1024;
  in.device_power_watts = 400;
  in.hosts = 128;
  in.host_power_watts = 200;
  const IronLawEstimate est = EstimateIronLaw(in);
  EXPECT_NEAR(est.train_days(), 3.04, 0.01 * 3.04);
  EXPECT_NEAR(est.fleet_power_watts, 435200, 1e-9);
  EXPECT_NEAR(est.energy_kwh, 31784, 0.01 * 31784);
  EXPECT_NEAR(est.energy_joules, est.energy_kwh * 3.6e6, 1e-6 * est.energy_joules);
}

TEST(IronLawTest, DoublingUtilizationHalvesTimeAndEnergy) {
  IronLawInputs in;
  in.total_flops = 1e21;
  in.peak_flops_per_device = 1e14;
  in.utilization = 0.25;
  in.devices = 8;
  in.device_power_watts = 300;
  const IronLawEstimate slow = EstimateIronLaw(in);
  in.utilization = 0.5;
  const IronLawEstimate fast = EstimateIronLaw(in);
  EXPECT_DOUBLE_EQ(slow.train_seconds, 2 * fast.train_seconds);
  EXPECT_DOUBLE_EQ(slow.energy_joules, 2 * fast.energy_joules);
}

TEST(IronLawTest, MissingInputsGiveZeros) {
  IronLawInputs in;
  in.total_flops = 1e21;
  in.devices = 8;
  const IronLawEstimate est = EstimateIronLaw(in);  // no peak, no utilization
  EXPECT_EQ(est.train_seconds, 0);
  EXPECT_EQ(est.energy_joules, 0);
}

}  // namespace
}  // namespace loom::planner
