#include "controller/workers/worker_registry.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

loom::v1::RegisterWorkerRequest Request(const std::string& node, int slots = 1, int gpus = 0) {
  loom::v1::RegisterWorkerRequest req;
  req.set_node(node);
  req.set_address("127.0.0.1");
  req.set_slots(slots);
  req.set_gpus(gpus);
  req.set_cpus(4);
  return req;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerRegistryTest() : registry_(&clock_, Options()) {}
  static WorkerRegistryOptions Options() {
    WorkerRegistryOptions o;
    o.worker_timeout = absl::Seconds(5);
    return o;
  }
  std::string Add(const std::string& node, int slots = 1, int gpus = 0) {
    return registry_.Add(Request(node, slots, gpus)).info.id();
  }

  FakeClock clock_;
  WorkerRegistry registry_;
};

TEST(WorkerRegistryValidationTest, RefusesWhatNoWorkerMayRegisterNamingTheField) {
  EXPECT_TRUE(WorkerRegistry::ValidateRegistration(Request("n")).ok());
  auto refused = [](loom::v1::RegisterWorkerRequest req) {
    absl::Status s = WorkerRegistry::ValidateRegistration(req);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return Msg(s);
  };
  EXPECT_THAT(refused(Request("")), StartsWith("node:"));
  {
    auto req = Request("n");
    req.clear_address();
    EXPECT_THAT(refused(req), StartsWith("address:"));
  }
  EXPECT_THAT(refused(Request("n", 0)), StartsWith("slots: must be >= 1, got 0"));
  EXPECT_THAT(refused(Request("n", 1, -1)), StartsWith("gpus:"));
  EXPECT_THAT(refused(Request("n", 1, 1025)), StartsWith("gpus:"));
  EXPECT_TRUE(WorkerRegistry::ValidateRegistration(Request("n", 1, 1024)).ok());
  {
    auto req = Request("n");
    req.set_gemm_flops_per_second_per_thread(std::nan(""));
    EXPECT_THAT(refused(req), StartsWith("gemm_flops_per_second_per_thread:"));
    req = Request("n");
    req.set_allreduce_bytes_per_second(std::numeric_limits<double>::infinity());
    EXPECT_THAT(refused(req), StartsWith("allreduce_bytes_per_second:"));
    req = Request("n");
    req.set_block_fixed_seconds(-1e-9);
    EXPECT_THAT(refused(req), StartsWith("block_fixed_seconds:"));
  }
  {
    auto req = Request("n");
    req.set_host_id(std::string(257, 'h'));
    EXPECT_THAT(refused(req), StartsWith("host_id:"));
    req.set_host_id(std::string(256, 'h'));
    EXPECT_TRUE(WorkerRegistry::ValidateRegistration(req).ok());
  }
}

TEST_F(WorkerRegistryTest, AddRegistersAnAliveWorkerUnderANewIdOfItsNode) {
  auto req = Request("node-a", 3, 2);
  req.set_zone("z1");
  req.set_rack("r7");
  req.set_memory_bytes(1 << 30);
  WorkerRegistry::Worker& w = registry_.Add(req);
  EXPECT_THAT(w.info.id(), MatchesRegex("node-a-[0-9a-f]{6}"));
  EXPECT_TRUE(w.info.alive());
  EXPECT_EQ(w.info.slots(), 3);
  EXPECT_EQ(w.info.gpus(), 2);
  EXPECT_EQ(w.info.rack(), "r7");
  EXPECT_EQ(w.last_heartbeat, clock_.Now());
  EXPECT_EQ(registry_.alive_count(), 1);
  EXPECT_EQ(registry_.Find(w.info.id()), &w);
  EXPECT_EQ(registry_.FindAlive(w.info.id()), &w);
  EXPECT_EQ(registry_.Find("node-a"), nullptr);
  auto listed = registry_.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].slots_used(), 0);
  EXPECT_EQ(listed[0].last_heartbeat_unix_ms(), clock_.NowUnixMillis());
}

// A node registering again means its previous daemon is gone: the registry
// drops it and says what it held, once.
TEST_F(WorkerRegistryTest, ReRegistrationOfANodeReplacesTheOldWorkerAndReportsWhatItHeld) {
  const std::string old_id = Add("node-a", 2);
  Add("node-b");
  WorkerRegistry::Worker* old = registry_.Find(old_id);
  registry_.HoldSlot(*old, {"job-1", 0, -1});
  registry_.HoldSlot(*old, {"job-2", 1, -1});
  clock_.Advance(absl::Seconds(2));

  EXPECT_FALSE(registry_.RemoveNode("node-c").has_value());
  auto gone = registry_.RemoveNode("node-a");
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->info.id(), old_id);
  EXPECT_TRUE(gone->info.alive());
  EXPECT_EQ(gone->silent, absl::Seconds(2));
  ASSERT_EQ(gone->ranks.size(), 2u);
  EXPECT_EQ(gone->ranks[0].job_id, "job-1");
  EXPECT_EQ(gone->ranks[1].job_id, "job-2");
  EXPECT_EQ(gone->ranks[1].rank, 1);
  EXPECT_EQ(registry_.Find(old_id), nullptr);
  EXPECT_EQ(registry_.alive_count(), 1);
  EXPECT_FALSE(registry_.RemoveNode("node-a").has_value());  // said once

  clock_.Advance(absl::Milliseconds(1));
  const std::string new_id = Add("node-a");
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(registry_.alive_count(), 2);
  EXPECT_EQ(registry_.List().size(), 2u);
  EXPECT_EQ(registry_.RemoveNode("node-a")->info.id(), new_id);
}

TEST_F(WorkerRegistryTest, ReRegistrationAfterDeathHoldsNothingAndCountsNoDeathTwice) {
  const std::string id = Add("node-a");
  registry_.HoldSlot(*registry_.Find(id), {"job-1", 0, -1});
  clock_.Advance(absl::Seconds(6));
  ASSERT_EQ(registry_.ExpireLeases().size(), 1u);
  EXPECT_EQ(registry_.alive_count(), 0);
  auto gone = registry_.RemoveNode("node-a");
  ASSERT_TRUE(gone.has_value());
  EXPECT_FALSE(gone->info.alive());
  EXPECT_THAT(gone->ranks, IsEmpty());  // given back when it died
  EXPECT_EQ(registry_.alive_count(), 0);
  Add("node-a");
  EXPECT_EQ(registry_.alive_count(), 1);
}

TEST_F(WorkerRegistryTest, LeaseExpiresOnlyPastWorkerTimeout) {
  const std::string a = Add("node-a", 2);
  const std::string b = Add("node-b");
  WorkerRegistry::Worker* wa = registry_.Find(a);
  registry_.HoldSlot(*wa, {"job-1", 0, -1});
  registry_.HoldSlot(*wa, {"job-1", 1, -1});
  wa->pending_commands.emplace_back();
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry_.RecordHeartbeat(b, 0).ok());

  clock_.Advance(absl::Seconds(2));  // a: silent exactly worker_timeout
  EXPECT_THAT(registry_.ExpireLeases(), IsEmpty());
  EXPECT_EQ(registry_.alive_count(), 2);

  clock_.Advance(absl::Nanoseconds(1));
  auto dead = registry_.ExpireLeases();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.id(), a);
  EXPECT_EQ(dead[0].info.node(), "node-a");
  EXPECT_EQ(dead[0].silent, absl::Seconds(5) + absl::Nanoseconds(1));
  EXPECT_EQ(dead[0].last_heartbeat, clock_.Now() - dead[0].silent);
  ASSERT_EQ(dead[0].ranks.size(), 2u);
  EXPECT_EQ(dead[0].ranks[1].rank, 1);
  EXPECT_EQ(registry_.alive_count(), 1);
  // Dead stays dead: found, but not alive, holding and owed nothing.
  ASSERT_NE(registry_.Find(a), nullptr);
  EXPECT_FALSE(registry_.Find(a)->info.alive());
  EXPECT_THAT(registry_.Find(a)->ranks, IsEmpty());
  EXPECT_THAT(registry_.Find(a)->pending_commands, IsEmpty());
  EXPECT_EQ(registry_.FindAlive(a), nullptr);
  EXPECT_EQ(registry_.RecordHeartbeat(a, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(registry_.ExpireLeases(), IsEmpty());  // declared once

  clock_.Advance(absl::Seconds(3));  // b: 6 s since its heartbeat
  dead = registry_.ExpireLeases();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.id(), b);
  EXPECT_EQ(registry_.alive_count(), 0);
  EXPECT_EQ(registry_.RecordHeartbeat("nobody", 0).status().code(),
            absl::StatusCode::kNotFound);
}

// The controller's own pause (its VM frozen, its process stopped) is not
// its workers' silence: after a gap of 11 s in which the registry saw
// nothing (no check, no heartbeat), a worker heard before it is not
// declared dead on the controller's waking. b's heartbeat, taken when the
// controller woke but before its next check, ends the pause: b is renewed
// and a gets its credit then. Both still die after a timeout of silence
// the controller was there to see.
TEST(WorkerRegistryPauseTest, TheControllersOwnPauseIsNotItsWorkersSilence) {
  FakeClock clock;
  WorkerRegistryOptions o;
  o.worker_timeout = absl::Seconds(3);
  o.pause_threshold = absl::Seconds(1);
  WorkerRegistry registry(&clock, o);
  const std::string a = registry.Add(Request("node-a")).info.id();
  const std::string b = registry.Add(Request("node-b")).info.id();
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  clock.Advance(absl::Milliseconds(500));
  ASSERT_TRUE(registry.RecordHeartbeat(a, 0).ok());
  ASSERT_TRUE(registry.RecordHeartbeat(b, 0).ok());
  clock.Advance(absl::Milliseconds(100));
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  EXPECT_EQ(registry.paused(), absl::ZeroDuration());

  // Frozen from 0.6 s to 11.6 s, where b's heartbeat is the first thing
  // taken; the next check comes 1 s later.
  clock.Advance(absl::Seconds(11));
  ASSERT_TRUE(registry.RecordHeartbeat(b, 0).ok());
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty()) << "a was declared dead for the pause";
  EXPECT_EQ(registry.paused(), absl::Seconds(10));  // the 11 s gap beyond 1 s
  EXPECT_EQ(registry.alive_count(), 2);

  // a's lease counts the 0.1 s before the gap, the 1 s allowed in it and
  // the 1 s since: with checks on time again, it dies 0.9 s later; b, heard
  // at the waking and owed no credit, 2 s later.
  clock.Advance(absl::Milliseconds(500));
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  clock.Advance(absl::Milliseconds(400));
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  clock.Advance(absl::Nanoseconds(1));
  auto dead = registry.ExpireLeases();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.id(), a);
  // Its silence as it was, and how much of it was the controller's pause.
  EXPECT_EQ(dead[0].silent, absl::Seconds(13) + absl::Nanoseconds(1));
  EXPECT_EQ(dead[0].paused, absl::Seconds(10));
  EXPECT_EQ(dead[0].last_heartbeat, clock.Now() - dead[0].silent);
  clock.Advance(absl::Milliseconds(600));
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  clock.Advance(absl::Milliseconds(500));
  dead = registry.ExpireLeases();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.id(), b);
  EXPECT_EQ(dead[0].paused, absl::ZeroDuration());
  EXPECT_EQ(registry.paused(), absl::Seconds(10));
}

// A worker heard after the controller's last check but just before it
// froze is owed the pause too: the gap is measured from the last thing the
// registry did, a check or a heartbeat. (Measured from the last check, it
// was not credited, and a whole host frozen for 8 s had its one worker
// declared dead on waking: ClusterTest.HostFrozenPastTheLease...)
TEST(WorkerRegistryPauseTest, AWorkerHeardJustBeforeThePauseIsOwedItToo) {
  FakeClock clock;
  WorkerRegistry registry(&clock, WorkerRegistryOptions{absl::Seconds(3), absl::Seconds(1)});
  const std::string a = registry.Add(Request("node-a")).info.id();
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
  clock.Advance(absl::Milliseconds(50));
  ASSERT_TRUE(registry.RecordHeartbeat(a, 0).ok());
  clock.Advance(absl::Seconds(8));  // frozen
  EXPECT_THAT(registry.ExpireLeases(), IsEmpty())
      << "a, heard just before the pause, was declared dead for it";
  EXPECT_EQ(registry.paused(), absl::Seconds(7));
  // The 1 s allowed in the gap counts: dead 2 s after the waking.
  for (int i = 0; i < 4; ++i) {
    clock.Advance(absl::Milliseconds(500));
    EXPECT_THAT(registry.ExpireLeases(), IsEmpty()) << i;
  }
  clock.Advance(absl::Nanoseconds(1));
  auto dead = registry.ExpireLeases();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.id(), a);
  EXPECT_EQ(dead[0].paused, absl::Seconds(7));
  EXPECT_EQ(dead[0].silent, absl::Seconds(10) + absl::Nanoseconds(1));
}

// Checks that keep coming late (a starved controller) still expire a
// silent worker: each late check counts the threshold as silence.
TEST(WorkerRegistryPauseTest, ChecksThatKeepComingLateStillExpireASilentWorker) {
  FakeClock clock;
  auto checks_until_dead = [&](absl::Duration pause_threshold) {
    WorkerRegistry registry(&clock, WorkerRegistryOptions{absl::Seconds(3), pause_threshold});
    (void)registry.Add(Request("node-a"));
    EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
    clock.Advance(absl::Milliseconds(100));
    EXPECT_THAT(registry.ExpireLeases(), IsEmpty());
    int checks = 0;
    while (registry.alive_count() > 0 && checks < 100) {
      clock.Advance(absl::Milliseconds(1500));
      (void)registry.ExpireLeases();
      ++checks;
    }
    return checks;
  };
  // 0.1 + 1 + 1 + 1 s > 3 s: dead at the third late check.
  EXPECT_EQ(checks_until_dead(absl::Seconds(1)), 3);
  // Off (the default), every second counts: 0.1 + 1.5 + 1.5 s, the second.
  EXPECT_EQ(checks_until_dead(absl::InfiniteDuration()), 2);
}

// The lease order replaces a pass over every worker: against that pass,
// over many workers heartbeating in random order, re-registering and dying
// in between, it declares exactly the same workers dead, in id order.
TEST_F(WorkerRegistryTest, LeaseOrderDeclaresTheSameWorkersAsAFullPass) {
  std::mt19937 rng(7);
  std::vector<std::string> nodes;
  for (int i = 0; i < 200; ++i) nodes.push_back(absl::StrCat("n", i));
  std::map<std::string, std::string> id_of;  // node -> its current worker
  for (const std::string& n : nodes) id_of[n] = Add(n);
  for (int round = 0; round < 60; ++round) {
    clock_.Advance(absl::Milliseconds(50 + rng() % 400));
    for (const std::string& n : nodes) {
      const unsigned dice = rng() % 100;
      if (dice < 40) {
        (void)registry_.RecordHeartbeat(id_of[n], 0);  // NOT_FOUND once dead
      } else if (dice < 42) {
        registry_.RemoveNode(n);
        id_of[n] = Add(n);
      }
    }
    // What a full pass would declare dead now.
    std::vector<std::string> expected;
    for (const auto& [n, id] : id_of) {
      const WorkerRegistry::Worker* w = registry_.Find(id);
      if (w->info.alive() && clock_.Now() - w->last_heartbeat > absl::Seconds(5)) {
        expected.push_back(id);
      }
    }
    std::sort(expected.begin(), expected.end());
    std::vector<std::string> declared;
    for (const auto& d : registry_.ExpireLeases()) declared.push_back(d.info.id());
    ASSERT_EQ(declared, expected) << "round " << round;
    int alive = 0;
    for (const auto& [n, id] : id_of) alive += registry_.Find(id)->info.alive() ? 1 : 0;
    ASSERT_EQ(registry_.alive_count(), alive);
  }
}

TEST_F(WorkerRegistryTest, HeartbeatSaysWhenAFreshRendezvousPortCame) {
  const std::string a = Add("node-a");
  auto beat = registry_.RecordHeartbeat(a, 0);
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->worker, registry_.Find(a));
  EXPECT_FALSE(beat->rendezvous_port_came);
  EXPECT_FALSE(registry_.RecordHeartbeat(a, 70000)->rendezvous_port_came);  // out of range
  EXPECT_EQ(registry_.Find(a)->rendezvous_port, 0);
  clock_.Advance(absl::Seconds(1));
  beat = registry_.RecordHeartbeat(a, 29500);
  EXPECT_TRUE(beat->rendezvous_port_came);
  EXPECT_EQ(beat->worker->rendezvous_port, 29500);
  EXPECT_EQ(beat->worker->last_heartbeat, clock_.Now());
  // Still unused: a newer port is kept, but nothing new came.
  EXPECT_FALSE(registry_.RecordHeartbeat(a, 29501)->rendezvous_port_came);
  EXPECT_EQ(registry_.Find(a)->rendezvous_port, 29501);
  registry_.Find(a)->rendezvous_port = 0;  // used by a placement
  EXPECT_TRUE(registry_.RecordHeartbeat(a, 29502)->rendezvous_port_came);
}

TEST_F(WorkerRegistryTest, OffersAreTheAliveWorkersFreeSlotsAndGpus) {
  const std::string a = Add("node-a", 4, 2);
  const std::string b = Add("node-b", 2, 0);
  registry_.HoldSlot(*registry_.Find(a), {"job-1", 0, 1});
  registry_.HoldSlot(*registry_.Find(a), {"job-2", 0, -1});  // a CPU rank
  registry_.HoldSlot(*registry_.Find(b), {"job-2", 1, -1});

  auto offers = registry_.Offers(/*with_free_gpus=*/true);
  ASSERT_EQ(offers.size(), 2u);
  EXPECT_EQ(offers[0].info.id(), a);
  EXPECT_EQ(offers[0].free_slots, 2);
  EXPECT_THAT(offers[0].free_gpus, ElementsAre(0));
  EXPECT_EQ(offers[1].free_slots, 1);
  EXPECT_THAT(offers[1].free_gpus, IsEmpty());
  EXPECT_THAT(registry_.Offers(false)[0].free_gpus, IsEmpty());

  auto listed = registry_.List();
  EXPECT_EQ(listed[0].slots_used(), 2);
  EXPECT_EQ(listed[1].slots_used(), 1);

  // A dead worker offers nothing, but the planner still sees it.
  ASSERT_TRUE(registry_.RecordHeartbeat(a, 0).ok());
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry_.RecordHeartbeat(a, 0).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_EQ(registry_.ExpireLeases().size(), 1u);  // b
  offers = registry_.Offers(true);
  ASSERT_EQ(offers.size(), 1u);
  EXPECT_EQ(offers[0].info.id(), a);
  EXPECT_EQ(registry_.Infos().size(), 2u);
}

TEST_F(WorkerRegistryTest, ACordonedNodeIsOfferedToNoRankUntilItsCordonEnds) {
  const std::string a = Add("node-a", 2, 0);
  const std::string b = Add("node-b", 2, 0);
  registry_.Cordon("node-a", clock_.Now() + absl::Seconds(3), "a slow rank");
  EXPECT_TRUE(registry_.IsCordoned("node-a"));
  EXPECT_FALSE(registry_.IsCordoned("node-b"));
  auto offers = registry_.Offers(false);
  ASSERT_EQ(offers.size(), 1u);
  EXPECT_EQ(offers[0].info.id(), b);
  auto listed = registry_.List();
  EXPECT_EQ(listed[0].cordoned_until_unix_ms(),
            absl::ToUnixMillis(clock_.Now() + absl::Seconds(3)));
  EXPECT_EQ(listed[0].cordon_reason(), "a slow rank");
  EXPECT_EQ(listed[1].cordoned_until_unix_ms(), 0);
  // By node: the node's next worker is cordoned too, until the time is up.
  ASSERT_TRUE(registry_.RemoveNode("node-a").has_value());
  const std::string a2 = Add("node-a", 2, 0);
  EXPECT_EQ(registry_.Offers(false).size(), 1u);
  ASSERT_TRUE(registry_.RecordHeartbeat(b, 0).ok());
  ASSERT_TRUE(registry_.RecordHeartbeat(a2, 0).ok());
  clock_.Advance(absl::Seconds(3));
  EXPECT_FALSE(registry_.IsCordoned("node-a"));
  EXPECT_EQ(registry_.Offers(false).size(), 2u);
  EXPECT_EQ(registry_.List()[0].cordoned_until_unix_ms(), 0);
  (void)a;
}

TEST_F(WorkerRegistryTest, SlotsAreReleasedByExitByPredicateAndByJob) {
  const std::string a = Add("node-a", 4);
  const std::string b = Add("node-b", 4);
  WorkerRegistry::Worker& wa = *registry_.Find(a);
  WorkerRegistry::Worker& wb = *registry_.Find(b);
  registry_.HoldSlot(wa, {"job-1", 0, -1});
  registry_.HoldSlot(wa, {"job-1", 1, -1});
  registry_.HoldSlot(wa, {"job-2", 0, -1});
  registry_.HoldSlot(wb, {"job-1", 2, -1});
  registry_.HoldSlot(wb, {"job-3", 0, -1});
  wa.unacked[{"job-1", 1}] = {loom::v1::StartRank(), clock_.Now()};
  wa.unacked[{"job-2", 0}] = {loom::v1::StartRank(), clock_.Now()};

  registry_.RankExited(wa, "job-1", 1);
  EXPECT_EQ(wa.ranks.size(), 2u);
  EXPECT_EQ(wa.unacked.count({"job-1", 1}), 0u);
  EXPECT_EQ(wa.unacked.count({"job-2", 0}), 1u);

  EXPECT_FALSE(registry_.ReleaseSlotsIf(wb, [](const auto& s) { return s.job_id == "job-9"; }));
  EXPECT_TRUE(registry_.ReleaseSlotsIf(wb, [](const auto& s) { return s.job_id == "job-3"; }));
  ASSERT_EQ(wb.ranks.size(), 1u);

  registry_.ReleaseJobSlots("job-1");
  ASSERT_EQ(wa.ranks.size(), 1u);
  EXPECT_EQ(wa.ranks[0].job_id, "job-2");
  EXPECT_THAT(wb.ranks, IsEmpty());
}

}  // namespace
}  // namespace loom::controller
