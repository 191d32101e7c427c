// The rendezvous port a worker offers the controller in each heartbeat.
#ifndef LOOM_WORKER_FREE_PORT_H_
#define LOOM_WORKER_FREE_PORT_H_

namespace loom::worker {

// A TCP port that is free on this host right now (bound then released),
// from [20000, 30000) when that lies outside the kernel's ephemeral range,
// else any; 0 when none could be bound.
int PickFreePort();

}  // namespace loom::worker

#endif  // LOOM_WORKER_FREE_PORT_H_
