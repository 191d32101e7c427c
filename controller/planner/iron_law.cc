#include "controller/planner/iron_law.h"

namespace loom::planner {

IronLawEstimate EstimateIronLaw(const IronLawInputs& in) {
  IronLawEstimate out;
  if (!(in.total_flops > 0 && in.peak_flops_per_device > 0 && in.utilization > 0 &&
        in.devices > 0)) {
    return out;
  }
  const double devices = static_cast<double>(in.devices);
  // T = O / (R_peak x eta), with R_peak the fleet's peak (the chapter, 80-84).
  out.train_seconds = in.total_flops / (devices * in.peak_flops_per_device * in.utilization);
  out.device_seconds = out.train_seconds * devices;
  out.device_hours = out.device_seconds / 3600.0;
  out.cost_usd = out.device_hours * in.price_per_device_hour_usd;
  // E = P_fleet x T (the chapter, 1555-1562).
  out.fleet_power_watts =
      devices * in.device_power_watts + static_cast<double>(in.hosts) * in.host_power_watts;
  out.energy_joules = out.fleet_power_watts * out.train_seconds;
  out.energy_kwh = out.energy_joules / 3.6e6;
  return out;
}

}  // namespace loom::planner
