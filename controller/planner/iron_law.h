// The iron law of training performance and what follows from it: wall-clock
// time, device-hours, rental cost and energy of a whole run.
//
//   T_train = O / (R_peak x eta)                  (the chapter, lines 80-84)
//   E_total = P_fleet x T_train,  P_fleet = N_dev x P_dev + N_host x P_host
//                                                 (the chapter, lines 1555-1562)
//
// Units: FLOPs, FLOP/s, seconds, watts, joules, US dollars. Pure functions.
#ifndef LOOM_CONTROLLER_PLANNER_IRON_LAW_H_
#define LOOM_CONTROLLER_PLANNER_IRON_LAW_H_

#include <cstdint>

namespace loom::planner {

struct IronLawInputs {
  double total_flops = 0;             // O: model FLOPs of the whole run
  double peak_flops_per_device = 0;   // R_peak of one device
  double utilization = 0;             // eta (MFU), in (0, 1]
  int64_t devices = 0;
  double price_per_device_hour_usd = 0;
  double device_power_watts = 0;
  int64_t hosts = 0;
  double host_power_watts = 0;        // per host, beyond its devices
};

struct IronLawEstimate {
  double train_seconds = 0;     // wall clock
  double device_seconds = 0;    // train_seconds x devices
  double device_hours = 0;
  double cost_usd = 0;
  double fleet_power_watts = 0;
  double energy_joules = 0;
  double energy_kwh = 0;
  double train_days() const { return train_seconds / 86400.0; }
};

// All zeros when total_flops, peak, utilization or devices is not positive.
IronLawEstimate EstimateIronLaw(const IronLawInputs& inputs);

// 6 x P x D: training FLOPs of a dense model with P parameters on D tokens
// (Kaplan et al. 2020, Sec. 2.1; forward 2PD + backward 4PD).
inline double SixPD(double parameters, double tokens) { return 6.0 * parameters * tokens; }

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_IRON_LAW_H_
