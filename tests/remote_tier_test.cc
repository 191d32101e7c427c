// The object-store tier of checkpoints on a real local cluster, with a real
// S3-compatible store (Ceph's RADOS Gateway on loopback): the daemons take the store's
// endpoint and credentials from their environment, as `loomctl local up`
// started with AWS_* variables gives them.
#include <signal.h>

#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/object_store/remote_checkpoints.h"
#include "common/object_store/s3_test_server.h"
#include "tests/cluster_fixture.h"

namespace loom {
namespace {

constexpr char kBucket[] = "loom-ckpt";

class RemoteTierTest : public ClusterTest {
 protected:
  void StartStoreAndCluster(int workers) {
    auto s = object_store::S3TestServer::Start(kBucket);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    // loomctl, and so every daemon `local up` starts, sees the store.
    ctl_prefix_ = "env";
    for (const std::string& kv : store_->Environment()) ctl_prefix_ += " " + kv;
    ctl_prefix_ += " ";
    ASSERT_NO_FATAL_FAILURE(StartCluster(workers));
  }
  // Objects under s3://loom-ckpt/<prefix> as Debian's s3cmd lists them
  // (an independent client): "size key" lines.
  std::string S3cmd() {
    return absl::StrCat("s3cmd --no-ssl --host=127.0.0.1:", store_->port(),
                        " --host-bucket= --access_key=", store_->access_key(),
                        " --secret_key=", store_->secret_key(),
                        " --region=us-east-1 --config=/dev/null ");
  }
  std::vector<std::string> S3cmdList(const std::string& prefix) {
    auto r = RunCommand(absl::StrCat(S3cmd(), "ls -r s3://", kBucket, "/", prefix));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    std::vector<std::string> out;
    for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() >= 4) out.push_back(absl::StrCat(f[2], " ", f[3]));
    }
    return out;
  }
  loom::v1::ListCheckpointsResponse Catalog(const std::string& job) {
    auto listed = Ctl("-o json checkpoints " + job);
    EXPECT_EQ(listed.exit_code, 0) << listed.err;
    loom::v1::ListCheckpointsResponse catalog;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(listed.out, &catalog).ok());
    return catalog;
  }

  // Whether the catalog records a copy in the store of `job`'s checkpoint
  // at `step`.
  bool HasRemoteCopy(const std::string& job, int64_t step) {
    const loom::v1::ListCheckpointsResponse catalog = Catalog(job);
    for (const auto& c : catalog.checkpoints()) {
      if (c.step() == step && !c.remote_url().empty()) return true;
    }
    return false;
  }

  std::unique_ptr<object_store::S3TestServer> store_;
};

// Every local checkpoint of a running job wiped and its ranks killed: the
// restart restores the newest uploaded checkpoint from the store (checked
// object by object against its manifest's SHA-256) and the job ends
// bitwise equal to its uninterrupted run.
TEST_F(RemoteTierTest, WipedJobResumesFromTheObjectStoreAndMatchesItsUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(StartStoreAndCluster(1));
  constexpr int kSteps = 3000;
  const std::string ckpt = "checkpoint: {interval_steps: 100, keep: 2";
  const std::string reference = Submit(WriteSpec("uncut", kSteps, 1, ckpt + "}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(reference).DebugString();
  const std::string want = Digest(CheckpointPathAt(reference, kSteps));
  ASSERT_FALSE(want.empty());

  const std::string remote = absl::StrCat("s3://", kBucket, "/runs");
  // The store keeps the newest 2 and every 1000th (and the rollback window).
  const std::string job = Submit(WriteSpec(
      "tiered", kSteps, 1,
      ckpt + ", remote: \"" + remote + "\", retention: {remote: {newest: 2, every: 1000}}}\n"));
  // An uploaded checkpoint past step 300, with the run far from its end.
  int64_t uploaded = 0;
  std::string dir;
  ASSERT_TRUE(WaitFor(
      [&] {
        const loom::v1::ListCheckpointsResponse catalog = Catalog(job);
        for (const auto& c : catalog.checkpoints()) {
          if (!c.remote_url().empty() && c.step() >= 300) {
            uploaded = c.step();
            dir = std::filesystem::path(c.path()).parent_path().string();
          }
        }
        return uploaded > 0;
      },
      120))
      << Status(job).DebugString();
  ASSERT_LT(Status(job).summary().last_step(), kSteps - 500) << "the wipe must land mid-run";

  // Freeze the ranks, wipe every checkpoint, then kill them.
  const std::set<int> pids = RankPids(job, home_);
  ASSERT_EQ(pids.size(), 1u);
  for (int pid : pids) kill(pid, SIGSTOP);
  int wiped = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("step-", 0) == 0) {
      std::filesystem::remove_all(e.path());
      ++wiped;
    }
  }
  ASSERT_GE(wiped, 1);
  for (int pid : pids) kill(pid, SIGKILL);

  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 1);
  const loom::v1::RecoveryEvent* restart = nullptr;
  for (const auto& e : done.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::RESTART) restart = &e;
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::CHECKPOINT_UPLOAD_FAILED) << e.message();
  }
  ASSERT_NE(restart, nullptr) << done.DebugString();
  EXPECT_EQ(Digest(CheckpointPathAt(job, kSteps)), want)
      << "the resumed run must end bitwise equal to the uninterrupted one";

  // Rank 0 said where its state came from: the store, not the directory.
  auto logs = Ctl(absl::StrCat("logs ", job, " --rank 0 --attempt 1"));
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("object store: restored step ")));
  EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("from ", remote, "/", job, "/step-")));
  EXPECT_THAT(logs.out, HasSubstr("verified"));
  for (absl::string_view line : absl::StrSplit(logs.out, '\n')) {
    if (absl::StrContains(line, "object store:")) std::cout << line << "\n";
  }
  std::cout << "wiped " << wiped << " checkpoint(s) with step " << uploaded << " uploaded; "
            << restart->message() << std::endl;

  // The catalog: every checkpoint the run kept locally at the end is also
  // remote, the final one included (its upload ends after the job did).
  ASSERT_TRUE(WaitFor([&] { return HasRemoteCopy(job, kSteps); }, 60));
  auto table = Ctl("checkpoints " + job);
  ASSERT_EQ(table.exit_code, 0);
  EXPECT_THAT(table.out, HasSubstr("TIER"));
  EXPECT_THAT(table.out, HasSubstr("local+remote"));
  EXPECT_THAT(table.out, HasSubstr("remote copy s3://"));

  // Retention in the store: the newest 2 (3000, 2900), every 1000th (1000,
  // 2000) and the rollback window (down to the newest at or before 3000 -
  // 2 x 100) are left, by an independent client's listing; each deletion is
  // in the event log with its tier and reason, and the catalog says it.
  // (Uploads lag the saves on a busy machine: a checkpoint the store keeps
  // for good waits in the directory until its upload, which may end after
  // the job's.)
  const std::set<std::string> want_remote = {"000001000", "000002000", "000002800", "000002900",
                                             "000003000"};
  std::set<std::string> remote_steps;
  WaitFor(
      [&] {
        remote_steps.clear();
        for (const std::string& o : S3cmdList(absl::StrCat("runs/", job, "/"))) {
          if (absl::EndsWith(o, "/MANIFEST.json")) {
            remote_steps.insert(std::string(o.substr(o.size() - 23, 9)));
          }
        }
        return remote_steps == want_remote;
      },
      60);
  EXPECT_EQ(remote_steps, want_remote);
  auto events = Ctl("events " + job);
  ASSERT_EQ(events.exit_code, 0) << events.err;
  auto pruned_line = [&](absl::string_view tier, absl::string_view reason) {
    for (absl::string_view line : absl::StrSplit(events.out, '\n')) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() > 3 && f[2] == "CHECKPOINT_PRUNED" && f[3] == tier &&
          absl::StrContains(line, reason)) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(pruned_line("remote",
                          "not among the newest 2, not a multiple of 1000, older than "
                          "the rollback window"))
      << events.out;
  EXPECT_TRUE(pruned_line("local", "not among the newest 2")) << events.out;
  // The catalog agrees: a remote copy is recorded for the kept steps only,
  // and the others say why theirs went.
  // (How many were uploaded and then pruned depends on how far the uploads
  // lagged the saves: the uploader takes the newest first, and one the
  // directory let go before its upload never reaches the store.)
  int remote_pruned = 0;
  const loom::v1::ListCheckpointsResponse catalog = Catalog(job);
  for (const auto& c : catalog.checkpoints()) {
    const std::string step = absl::StrFormat("%09d", c.step());
    if (!c.remote_pruned_reason().empty()) {
      ++remote_pruned;
      EXPECT_EQ(remote_steps.count(step), 0u)
          << "step " << c.step() << " is recorded as pruned from the store, which holds it";
    }
    if (!c.remote_url().empty()) {
      EXPECT_TRUE(remote_steps.count(step) > 0)
          << "step " << c.step() << " is recorded as in the store";
    }
  }
  EXPECT_GE(remote_pruned, 1);
  // The controller's dry run reaches the pruners' verdicts: nothing is left
  // to delete on either tier, and it says what is protected.
  auto gc = Ctl("checkpoints gc " + job + " --dry-run");
  ASSERT_EQ(gc.exit_code, 0) << gc.out << gc.err;
  EXPECT_THAT(gc.out, HasSubstr("retention: local newest 2; remote newest 2, every 1000 steps"));
  EXPECT_THAT(gc.out, HasSubstr("always kept: remote: the rollback window"));
  EXPECT_THAT(gc.out, HasSubstr("dry run: 0 of 8 checkpoint copies would be deleted"));
  std::cout << "loomctl checkpoints gc " << job << " --dry-run:\n" << gc.out << std::endl;

  // What the store holds, by an independent client: each checkpoint's shard
  // and manifest, and the final shard's bytes as the manifest's SHA-256 says.
  const std::vector<std::string> objects = S3cmdList(absl::StrCat("runs/", job, "/"));
  const std::string final_prefix = absl::StrCat(remote, "/", job, "/step-000003000/");
  bool shard = false, manifest = false;
  for (const std::string& o : objects) {
    shard = shard || absl::EndsWith(o, final_prefix + "shard-00000.bin");
    manifest = manifest || absl::EndsWith(o, final_prefix + "MANIFEST.json");
  }
  EXPECT_TRUE(shard && manifest) << absl::StrJoin(objects, "\n");
  const std::string fetched = loom::testing::MakeTempDir("loom_s3cmd") + "/MANIFEST.json";
  auto get = RunCommand(absl::StrCat(S3cmd(), "get ", final_prefix, "MANIFEST.json ", fetched));
  ASSERT_EQ(get.exit_code, 0) << get.out << get.err;
  auto manifest_text = ReadFile(fetched);
  ASSERT_TRUE(manifest_text.ok());
  auto local_shard_sha = RunCommand(
      absl::StrCat("sha256sum ", ShellQuote(CheckpointPathAt(job, kSteps) + "/shard-00000.bin")));
  ASSERT_EQ(local_shard_sha.exit_code, 0);
  EXPECT_THAT(*manifest_text,
              HasSubstr(absl::StrCat("\"sha256\": \"", local_shard_sha.out.substr(0, 64), "\"")));
}

// The store goes away mid-run: training goes on with the directory alone,
// the job records one CHECKPOINT_UPLOAD_FAILED event naming the worker, the
// object and the store's answer, and once the store is back the
// checkpoints after it are uploaded again; the job ends without a restart.
TEST_F(RemoteTierTest, AStoreThatGoesAwayCostsTrainingNothingAndIsCaughtUpWith) {
  ASSERT_NO_FATAL_FAILURE(StartStoreAndCluster(1));
  constexpr int kSteps = 10000;  // ~30 s: room for the outage and the uploads after it
  const std::string remote = absl::StrCat("s3://", kBucket, "/runs");
  const std::string job =
      Submit(WriteSpec("outage", kSteps, 1,
                       "checkpoint: {interval_steps: 100, keep: 2, remote: \"" + remote + "\"}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 100; }, 120))
      << Status(job).DebugString();
  ASSERT_TRUE(store_->Kill().ok());
  const int64_t killed_at = Status(job).summary().last_step();
  // The next checkpoint's upload fails after the client's retries.
  const loom::v1::RecoveryEvent* failed = nullptr;
  loom::v1::Job now;
  ASSERT_TRUE(WaitFor(
      [&] {
        now = Status(job);
        for (const auto& e : now.events()) {
          if (e.kind() == loom::v1::RecoveryEvent::CHECKPOINT_UPLOAD_FAILED) failed = &e;
        }
        return failed != nullptr;
      },
      120))
      << now.DebugString();
  EXPECT_THAT(failed->message(), HasSubstr("was not uploaded to the object store"));
  EXPECT_THAT(failed->message(), HasSubstr("worker on node local-0"));
  EXPECT_THAT(failed->message(), HasSubstr(absl::StrCat(remote, "/", job, "/step-")));
  EXPECT_THAT(failed->message(), HasSubstr("no answer"));
  const std::string failed_message = failed->message();
  ASSERT_TRUE(store_->Restart().ok());
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0);
  int outage_events = 0;
  for (const auto& e : done.events()) {
    outage_events += e.kind() == loom::v1::RecoveryEvent::CHECKPOINT_UPLOAD_FAILED ? 1 : 0;
  }
  EXPECT_EQ(outage_events, 1) << "one event for the outage";
  // Uploads went on once the store was back: the final checkpoint is remote.
  ASSERT_TRUE(WaitFor([&] { return HasRemoteCopy(job, kSteps); }, 60));
  auto events = Ctl("events " + job);
  ASSERT_EQ(events.exit_code, 0) << events.err;
  EXPECT_THAT(events.out, HasSubstr("CHECKPOINT_UPLOAD_FAILED"));
  EXPECT_THAT(events.out, HasSubstr("CHECKPOINT_UPLOADED"));
  std::cout << "store killed at step " << killed_at << "; " << failed_message << "\n"
            << "loomctl events " << job << ":\n"
            << events.out << std::endl;
}

// Uploads a worker's loss cut short: the store is down when a checkpoint is
// committed, so it waits in its worker's backlog; that worker is killed
// (the backlog with it) and the store comes back. The job's next attempt,
// on the other worker, is told by the controller which committed
// checkpoints have no remote copy (StartRank.pending_uploads), and uploads
// them.
TEST_F(RemoteTierTest, UploadsAWorkersLossCutShortAreMadeByTheNextAttempt) {
  ASSERT_NO_FATAL_FAILURE(StartStoreAndCluster(2));
  constexpr int kSteps = 12000;  // ~40 s: room for the outage and the handover
  const std::string job =
      Submit(WriteSpec("handover", kSteps, 1,
                       absl::StrCat("checkpoint: {interval_steps: 100, keep: 30, remote: \"s3://",
                                    kBucket, "/runs\"}\n")));
  ASSERT_TRUE(WaitFor([&] { return HasRemoteCopy(job, 100); }, 120)) << Status(job).DebugString();
  ASSERT_TRUE(store_->Kill().ok());
  int64_t failed_step = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        const loom::v1::Job now = Status(job);
        for (const auto& e : now.events()) {
          if (e.kind() == loom::v1::RecoveryEvent::CHECKPOINT_UPLOAD_FAILED) failed_step = e.step();
        }
        return failed_step > 0;
      },
      120))
      << Status(job).DebugString();
  const loom::v1::Job before = Status(job);
  ASSERT_EQ(before.ranks_size(), 1);
  const std::string first_node = before.ranks(0).node();
  ASSERT_LT(before.summary().last_step(), kSteps - 3000) << "the handover must land mid-run";
  ASSERT_NO_FATAL_FAILURE(KillWorkerOnNode(first_node));
  ASSERT_TRUE(store_->Restart().ok());
  // The checkpoint whose upload failed goes up from the other worker.
  ASSERT_TRUE(WaitFor([&] { return HasRemoteCopy(job, failed_step); }, 180))
      << Status(job).DebugString();
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 240))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  ASSERT_EQ(done.ranks_size(), 1);
  EXPECT_NE(done.ranks(0).node(), first_node);
  EXPECT_GE(done.generation(), 1);
  std::cout << "upload of step " << failed_step << " failed on " << first_node
            << "; uploaded by the attempt on " << done.ranks(0).node() << std::endl;
}

// Credentials the store refuses: the job's first save says so, naming the
// bucket and where the credentials came from; no upload is retried (each
// checkpoint is tried once), no copy is listed as remote, and training
// finishes on the fast tier as if no store were named.
TEST_F(RemoteTierTest, RefusedCredentialsAreAClearErrorAtTheFirstSaveNotARetryLoop) {
  auto s = object_store::S3TestServer::Start(kBucket);
  ASSERT_TRUE(s.ok()) << s.status();
  store_ = *std::move(s);
  ctl_prefix_ = "env";
  for (const std::string& kv : store_->Environment()) {
    ctl_prefix_ += " " + (absl::StartsWith(kv, "AWS_SECRET_ACCESS_KEY=")
                              ? std::string("AWS_SECRET_ACCESS_KEY=not-the-secret")
                              : kv);
  }
  ctl_prefix_ += " ";
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  constexpr int kSteps = 400, kInterval = 100;
  const std::string job =
      Submit(WriteSpec("refused", kSteps, 1,
                       absl::StrCat("checkpoint: {interval_steps: ", kInterval,
                                    ", keep: 2, remote: \"s3://", kBucket, "/runs\"}\n")));
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 180))
      << Status(job).DebugString();
  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 0);
  std::vector<int64_t> failed_steps;
  for (const auto& e : done.events()) {
    if (e.kind() != loom::v1::RecoveryEvent::CHECKPOINT_UPLOAD_FAILED) continue;
    failed_steps.push_back(e.step());
    EXPECT_THAT(e.message(), HasSubstr("worker on node local-0"));
    EXPECT_THAT(e.message(), HasSubstr("403"));
    EXPECT_THAT(e.message(), HasSubstr(absl::StrCat("for bucket \"", kBucket, "\"")));
    EXPECT_THAT(e.message(), HasSubstr("refused the credentials from environment"));
  }
  // The first save's upload failed, and each checkpoint's at most once.
  ASSERT_FALSE(failed_steps.empty());
  EXPECT_EQ(failed_steps.front(), kInterval);
  EXPECT_LE(failed_steps.size(), static_cast<size_t>(kSteps / kInterval));
  std::set<int64_t> once(failed_steps.begin(), failed_steps.end());
  EXPECT_EQ(once.size(), failed_steps.size()) << absl::StrJoin(failed_steps, ",");
  const loom::v1::ListCheckpointsResponse catalog = Catalog(job);
  for (const auto& c : catalog.checkpoints()) {
    EXPECT_TRUE(c.remote_url().empty()) << c.DebugString();
  }
  EXPECT_TRUE(S3cmdList("runs/").empty());
  auto events = Ctl("events " + job);
  ASSERT_EQ(events.exit_code, 0) << events.err;
  std::cout << "loomctl events " << job << ":\n" << events.out << std::endl;
}

// init_from a checkpoint that only the object store still has: by job id
// (the controller resolves it to the remote copy) the new job starts from
// it, downloaded and verified by rank 0, and trains bitwise as a job started
// from the same checkpoint on disk did; a location with no checkpoint fails
// the job at once with the reason, spending no restart.
TEST_F(RemoteTierTest, AJobStartsFromACheckpointOnlyTheObjectStoreHas) {
  ASSERT_NO_FATAL_FAILURE(StartStoreAndCluster(1));
  const std::string remote = absl::StrCat("s3://", kBucket, "/runs");
  const std::string source = Submit(WriteSpec(
      "source", 300, 1, "checkpoint: {interval_steps: 100, remote: \"" + remote + "\"}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(source).state() == loom::v1::SUCCEEDED; }, 120))
      << Status(source).DebugString();
  ASSERT_TRUE(WaitFor([&] { return HasRemoteCopy(source, 300); }, 60));
  const std::string init = "checkpoint: {interval_steps: 100}\ninit_from: {job: " + source + "}\n";
  const std::string from_disk = Submit(WriteSpec("from-disk", 200, 1, init));
  EXPECT_EQ(Status(from_disk).spec().init_from().path(), CheckpointPathAt(source, 300));
  ASSERT_TRUE(WaitFor([&] { return Status(from_disk).state() == loom::v1::SUCCEEDED; }, 120))
      << Status(from_disk).DebugString();
  const std::string want = Digest(CheckpointPathAt(from_disk, 200));
  ASSERT_FALSE(want.empty());

  // Every local checkpoint of the source job gone: the store's copy is the
  // one left, and the catalog says so.
  std::filesystem::remove_all(std::filesystem::path(CheckpointPathAt(source, 300)).parent_path());
  const std::string copy = absl::StrCat(remote, "/", source, "/step-000000300");
  const std::string from_store = Submit(WriteSpec("from-store", 200, 1, init));
  EXPECT_EQ(Status(from_store).spec().init_from().path(), copy);
  ASSERT_TRUE(WaitFor([&] { return Status(from_store).state() == loom::v1::SUCCEEDED; }, 120))
      << Status(from_store).DebugString();
  EXPECT_EQ(Status(from_store).restarts(), 0);
  EXPECT_EQ(Digest(CheckpointPathAt(from_store, 200)), want)
      << "started from the store's copy, it must train as from the directory's";
  auto logs = Ctl("logs " + from_store + " --rank 0");
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("object store: init_from: fetched step 300 from " + copy));

  // A location where no checkpoint is: accepted (it names one), and the job
  // fails at its start saying what is missing.
  const std::string nowhere = absl::StrCat(remote, "/", source, "/step-000000299");
  const std::string missing = Submit(
      WriteSpec("from-nowhere", 200, 1,
                "checkpoint: {interval_steps: 100}\ninit_from: {path: \"" + nowhere + "\"}\n"));
  ASSERT_TRUE(WaitFor([&] { return Status(missing).state() == loom::v1::FAILED; }, 120))
      << Status(missing).DebugString();
  EXPECT_EQ(Status(missing).restarts(), 0);
  EXPECT_THAT(Status(missing).reason(), HasSubstr(nowhere + " has no MANIFEST.json"));
  // And one that is no checkpoint's location is refused at submit.
  auto bad =
      Ctl("submit " + WriteSpec("from-bucket", 200, 1, "init_from: {path: \"" + remote + "\"}\n"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("init_from.path: \"" + remote +
                                 "\" is not a checkpoint's location in an object store"));
}

}  // namespace
}  // namespace loom
