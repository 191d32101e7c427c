// failover: the Jepsen-style run of the HA controllers over many cycles
// (tests/failover_cluster.h): kill -9, SIGSTOP past the lease, and a
// partition from the database of the leading controller, in turn, while
// clients submit and cancel jobs and workers train and report. Prints each
// cycle, the checker's output and the failovers' event log.
//
// Usage: loom_failover_bench BIN_DIR [CYCLES] [LEASE_SECONDS]
// Last line: failover: <n> cycles, p99 <x> s, <lost> lost ratio=<p99/3>
// (the issue promises serving again within 3 s). Exit 1 when the checker
// found a gang scheduled twice, an acknowledged write lost or an epoch going
// backwards. Root only (network namespaces).
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_format.h"
#include "tests/failover_cluster.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: loom_failover_bench BIN_DIR [CYCLES] [LEASE_SECONDS]" << std::endl;
    return 2;
  }
  if (geteuid() != 0) {
    std::cerr << "failover: needs root (network namespaces)" << std::endl;
    return 2;
  }
  loom::testing::FailoverOptions o;
  o.bin_dir = argv[1];
  o.cycles = argc > 2 ? std::atoi(argv[2]) : 12;
  if (argc > 3) o.lease_s = std::atof(argv[3]);
  if (o.cycles < 1 || !(o.lease_s > 0)) {
    std::cerr << "failover: CYCLES >= 1 and LEASE_SECONDS > 0" << std::endl;
    return 2;
  }
  o.log = [](const std::string& line) { std::cout << line << std::endl; };
  absl::StatusOr<loom::testing::FailoverResult> r = loom::testing::RunFailoverCycles(o);
  if (!r.ok()) {
    std::cerr << "failover: " << r.status() << std::endl;
    return 1;
  }
  std::cout << r->checker_output << "the failovers, from the controllers' logs:\n"
            << r->one_failover;
  const int lost = r->lost_acked_writes;
  std::cout << absl::StrFormat("failover: %d cycles, p99 %.2f s, %d lost ratio=%.3f\n",
                               static_cast<int>(r->cycles.size()), r->p99_seconds, lost,
                               r->p99_seconds / 3.0);
  const bool clean = lost == 0 && r->double_scheduled_gangs == 0 && r->epochs_backwards == 0;
  return clean ? 0 : 1;
}
