// Summaries of the control-plane bench's latencies (bench/control_plane_bench.cc).
#ifndef LOOM_BENCH_CONTROL_PLANE_REPORT_H_
#define LOOM_BENCH_CONTROL_PLANE_REPORT_H_

#include <vector>

#include "bench/control_plane_fleet.h"

namespace loom::bench {

// The q-quantile of values sorted ascending (0 for none).
double Percentile(std::vector<double>& sorted_values, double q);

// Heartbeats (`a`) and step reports (`b`) together, binned by the second
// they were due in: prints how many seconds of the window had a p99 over
// 50 ms, and the worst few. Tells a tail spread over the whole window
// (queueing) from one made in a few bursts (a stall). Call before anything
// that sorts the stats.
void PrintTailBySecond(const RpcStats& a, const RpcStats& b);

}  // namespace loom::bench

#endif  // LOOM_BENCH_CONTROL_PLANE_REPORT_H_
