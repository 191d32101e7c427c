#include "common/object_store/remote_checkpoints.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace loom::object_store {
namespace {

using engine::CheckpointManifest;
using engine::kManifestFileName;
using engine::ManifestFile;
using engine::ParseManifest;
using engine::SerializeManifest;

std::string StepName(int64_t step) { return absl::StrFormat("step-%09d", step); }

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads up to `n` bytes (fewer only at the end of the file).
absl::StatusOr<size_t> ReadFull(int fd, char* buf, size_t n, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::DataLossError(Errno("read " + path));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

absl::Status WriteFull(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t w = ::write(fd, data.data(), data.size());
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return absl::InternalError(Errno("write " + path));
    data.remove_prefix(static_cast<size_t>(w));
  }
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) return absl::InternalError(Errno("fsync " + path));
  return absl::OkStatus();
}

// Uploads one file, checking it against `file` on the way; sets its SHA-256.
absl::Status UploadFile(S3Client& client, const S3Location& at, const std::string& dir,
                        ManifestFile* file, const TransferOptions& options) {
  const std::string path = dir + "/" + file->name;
  const std::string key = at.prefix + file->name;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return absl::DataLossError(Errno("open " + path));
  const size_t part = std::max<uint64_t>(1, std::min<uint64_t>(options.part_bytes, file->bytes));
  std::string buf(part, '\0');
  Sha256 sha;
  uint32_t crc = 0;
  uint64_t total = 0;
  const bool multipart = file->bytes > options.part_bytes;
  std::string upload_id;
  std::vector<std::string> etags;
  // Parts being sent, oldest first: each holds its bytes until sent.
  struct InFlight {
    std::unique_ptr<std::string> bytes;
    std::future<absl::StatusOr<std::string>> etag;
  };
  std::deque<InFlight> in_flight;
  absl::Status part_error;
  auto finish_oldest = [&] {
    absl::StatusOr<std::string> etag = in_flight.front().etag.get();
    in_flight.pop_front();
    if (!etag.ok() && part_error.ok()) part_error = etag.status();
    if (etag.ok()) etags.push_back(*std::move(etag));
  };
  auto fail = [&](absl::Status s) {
    while (!in_flight.empty()) finish_oldest();  // no part outlives this call
    if (!upload_id.empty()) (void)client.AbortMultipartUpload(at.bucket, key, upload_id);
    return s;
  };
  if (multipart) {
    ASSIGN_OR_RETURN(upload_id, client.CreateMultipartUpload(at.bucket, key));
  }
  const size_t max_in_flight = static_cast<size_t>(std::max(1, options.parts_in_flight));
  while (total < file->bytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(part, file->bytes - total));
    absl::StatusOr<size_t> got = ReadFull(fd.get(), buf.data(), want, path);
    if (!got.ok()) return fail(got.status());
    if (*got == 0) break;  // shorter than the manifest says
    const absl::string_view piece(buf.data(), *got);
    sha.Update(piece);
    crc = Crc32cExtend(crc, piece.data(), piece.size());
    total += *got;
    if (multipart) {
      // Parts complete in order of number: etags[i] is part i + 1's.
      while (in_flight.size() >= max_in_flight) finish_oldest();
      if (!part_error.ok()) return fail(part_error);
      auto bytes = std::make_unique<std::string>(piece);
      const absl::string_view body(*bytes);
      const int number = static_cast<int>(etags.size() + in_flight.size()) + 1;
      in_flight.push_back(
          {std::move(bytes),
           std::async(std::launch::async, [&client, &at, &key, &upload_id, number, body] {
             return client.UploadPart(at.bucket, key, upload_id, number, body);
           })});
    }
  }
  while (!in_flight.empty()) finish_oldest();
  if (!part_error.ok()) return fail(part_error);
  char extra = 0;
  absl::StatusOr<size_t> more = ReadFull(fd.get(), &extra, 1, path);
  if (!more.ok()) return fail(more.status());
  total += *more;  // longer than the manifest says
  if (total != file->bytes || crc != file->crc32c) {
    return fail(absl::DataLossError(absl::StrCat(
        path, ": ", total != file->bytes ? "size" : "crc32c", " does not match the manifest (",
        total, " bytes, crc32c ", Crc32cHex(crc), "; the manifest says ", file->bytes,
        " bytes, crc32c ", Crc32cHex(file->crc32c), "): not uploaded")));
  }
  // Checked before the object appears: a corrupt file is never uploaded
  // (a multipart upload completes only here).
  if (multipart) {
    absl::Status s = client.CompleteMultipartUpload(at.bucket, key, upload_id, etags);
    if (!s.ok()) return fail(s);
  } else {
    RETURN_IF_ERROR(client.PutObject(at.bucket, key, absl::string_view(buf.data(), total)));
  }
  file->sha256 = ToHex(sha.Finish());
  return absl::OkStatus();
}

// Downloads one object into `path`, checking it against `file`. An object
// larger than a part comes as ranged GETs of part_bytes, parts_in_flight of
// them at once, each checksummed and written in order as it arrives.
absl::Status DownloadFile(S3Client& client, const S3Location& at, const ManifestFile& file,
                          const std::string& path, const TransferOptions& options) {
  const std::string key = at.prefix + file.name;
  const std::string object = absl::StrCat("s3://", at.bucket, "/", key);
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return absl::InternalError(Errno("create " + path));
  Sha256 sha;
  uint32_t crc = 0;
  uint64_t total = 0;
  // Written-back as it comes (every 8 MiB, without waiting), so that the
  // fsync at the end finds little left and the disk works while the network
  // does.
  uint64_t flushed = 0;
  constexpr uint64_t kFlushBytes = 8ull << 20;
  auto take = [&](absl::string_view piece) -> absl::Status {
    total += piece.size();
    if (total > file.bytes) {
      return absl::DataLossError(
          absl::StrCat(object, ": longer than the manifest's ", file.bytes, " bytes"));
    }
    sha.Update(piece);
    crc = Crc32cExtend(crc, piece.data(), piece.size());
    RETURN_IF_ERROR(WriteFull(fd.get(), piece, path));
    if (total - flushed >= kFlushBytes) {
      (void)::sync_file_range(fd.get(), static_cast<off64_t>(flushed),
                              static_cast<off64_t>(total - flushed), SYNC_FILE_RANGE_WRITE);
      flushed = total;
    }
    return absl::OkStatus();
  };
  const uint64_t part = std::max<uint64_t>(options.part_bytes, 1);
  if (file.bytes > part && options.parts_in_flight > 1) {
    std::deque<std::future<absl::StatusOr<std::string>>> in_flight;
    absl::Status error;
    auto take_oldest = [&] {
      absl::StatusOr<std::string> bytes = in_flight.front().get();
      in_flight.pop_front();
      if (!error.ok()) return;
      error = bytes.ok() ? take(*bytes) : bytes.status();
    };
    for (uint64_t offset = 0; offset < file.bytes && error.ok(); offset += part) {
      while (in_flight.size() >= static_cast<size_t>(options.parts_in_flight)) take_oldest();
      const uint64_t length = std::min(part, file.bytes - offset);
      in_flight.push_back(std::async(std::launch::async, [&client, &at, &key, offset, length] {
        return client.GetObjectRange(at.bucket, key, offset, length);
      }));
    }
    while (!in_flight.empty()) take_oldest();  // no part outlives this call
    if (absl::IsOutOfRange(error)) {
      return absl::DataLossError(absl::StrCat(object, ": shorter than the manifest's ", file.bytes,
                                              " bytes (", error.message(), ")"));
    }
    RETURN_IF_ERROR(error);
    // Nothing past the manifest's length either.
    ASSIGN_OR_RETURN(ObjectInfo head, client.HeadObject(at.bucket, key));
    if (head.size != file.bytes) {
      return absl::DataLossError(
          absl::StrCat(object, ": ", head.size, " bytes, the manifest says ", file.bytes));
    }
  } else {
    RETURN_IF_ERROR(client.GetObject(at.bucket, key, take));
  }
  const std::string sha_hex = ToHex(sha.Finish());
  if (total != file.bytes) {
    return absl::DataLossError(
        absl::StrCat(object, ": ", total, " bytes, the manifest says ", file.bytes));
  }
  if (!file.sha256.empty() && sha_hex != file.sha256) {
    return absl::DataLossError(
        absl::StrCat(object, ": sha256 ", sha_hex, " does not match the manifest's ", file.sha256));
  }
  if (crc != file.crc32c) {
    return absl::DataLossError(absl::StrCat(object, ": crc32c ", Crc32cHex(crc),
                                            " does not match the manifest's ",
                                            Crc32cHex(file.crc32c)));
  }
  if (::fsync(fd.get()) != 0) return absl::InternalError(Errno("fsync " + path));
  return absl::OkStatus();
}

// Runs fn(i) for i in [0, n) on up to `threads` threads; the first error.
absl::Status ForEach(size_t n, int threads, const std::function<absl::Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status first;
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first.ok()) return;
      }
      absl::Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t count = std::min<size_t>(n, static_cast<size_t>(std::max(1, threads)));
  for (size_t t = 1; t < count; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return first;
}

}  // namespace

S3Location RemoteCheckpointLocation(const S3Location& job, int64_t step) {
  return job.Child(StepName(step));
}

absl::StatusOr<TransferReport> UploadCheckpoint(S3Client& client, const S3Location& job,
                                                const std::string& checkpoint_dir,
                                                const TransferOptions& options) {
  const absl::Time start = absl::Now();
  const std::string manifest_path = checkpoint_dir + "/" + kManifestFileName;
  absl::StatusOr<std::string> text = ReadFile(manifest_path);
  if (!text.ok())
    return absl::DataLossError(absl::StrCat(manifest_path, ": ", text.status().message()));
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ParseManifest(*text, manifest_path));
  const S3Location at = RemoteCheckpointLocation(job, manifest.state.step);
  if (std::filesystem::path(checkpoint_dir).filename() != StepName(manifest.state.step)) {
    return absl::DataLossError(absl::StrCat(manifest_path, " says step ", manifest.state.step,
                                            ", which is not its directory's"));
  }
  RETURN_IF_ERROR(ForEach(manifest.files.size(), options.threads, [&](size_t i) {
    return UploadFile(client, at, checkpoint_dir, &manifest.files[i], options);
  }));
  // Last: the checkpoint now exists remotely, whole.
  RETURN_IF_ERROR(
      client.PutObject(at.bucket, at.prefix + kManifestFileName, SerializeManifest(manifest)));
  TransferReport report;
  report.url = absl::StrCat("s3://", at.bucket, "/", absl::StripSuffix(at.prefix, "/"));
  report.step = manifest.state.step;
  for (const ManifestFile& f : manifest.files) report.bytes += f.bytes;
  report.objects = static_cast<int>(manifest.files.size()) + 1;
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return report;
}

absl::StatusOr<std::vector<RemoteCheckpoint>> ListRemoteCheckpoints(
    S3Client& client, const S3Location& job, std::vector<std::string>* unreadable) {
  ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, client.ListObjects(job.bucket, job.prefix));
  std::vector<RemoteCheckpoint> out;
  for (const ObjectInfo& o : objects) {
    absl::string_view rest = o.key;
    if (!absl::ConsumePrefix(&rest, job.prefix) || !absl::ConsumePrefix(&rest, "step-")) continue;
    const size_t slash = rest.find('/');
    int64_t step = 0;
    if (slash != 9 || rest.substr(slash + 1) != kManifestFileName ||
        !absl::SimpleAtoi(rest.substr(0, slash), &step)) {
      continue;
    }
    RemoteCheckpoint rc;
    rc.step = step;
    const S3Location at = RemoteCheckpointLocation(job, step);
    rc.url = absl::StrCat("s3://", at.bucket, "/", absl::StripSuffix(at.prefix, "/"));
    const std::string name = absl::StrCat("s3://", job.bucket, "/", o.key);
    absl::StatusOr<std::string> text = client.GetObject(job.bucket, o.key);
    if (text.status().code() == absl::StatusCode::kNotFound) continue;  // deleted meanwhile
    if (!text.ok()) return text.status();
    absl::StatusOr<CheckpointManifest> m = ParseManifest(*text, name);
    if (!m.ok() || m->state.step != step) {
      if (unreadable != nullptr) {
        unreadable->push_back(absl::StrCat(
            name, ": ", m.ok() ? absl::StrCat("says step ", m->state.step) : m.status().message()));
      }
      continue;
    }
    rc.manifest = *std::move(m);
    out.push_back(std::move(rc));
  }
  std::sort(out.begin(), out.end(), [](const RemoteCheckpoint& a, const RemoteCheckpoint& b) {
    if (a.manifest.state.generation != b.manifest.state.generation) {
      return a.manifest.state.generation > b.manifest.state.generation;
    }
    return a.step > b.step;
  });
  return out;
}

absl::Status DeleteRemoteCheckpoint(S3Client& client, const S3Location& job, int64_t step) {
  const S3Location at = RemoteCheckpointLocation(job, step);
  RETURN_IF_ERROR(client.DeleteObject(at.bucket, at.prefix + kManifestFileName));
  ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, client.ListObjects(at.bucket, at.prefix));
  for (const ObjectInfo& o : objects) RETURN_IF_ERROR(client.DeleteObject(at.bucket, o.key));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<engine::RetentionVerdict>> PruneRemoteCheckpoints(
    S3Client& client, const S3Location& job, const RemoteRetention& retention, bool apply) {
  ASSIGN_OR_RETURN(std::vector<RemoteCheckpoint> listed, ListRemoteCheckpoints(client, job));
  if (listed.empty()) return std::vector<engine::RetentionVerdict>{};
  std::vector<engine::RetentionCandidate> candidates;
  for (const RemoteCheckpoint& rc : listed) {
    engine::RetentionCandidate c{rc.url, rc.step, rc.manifest.state.generation, std::nullopt};
    if (rc.manifest.state.has_val_loss) c.val_loss = rc.manifest.state.val_loss;
    candidates.push_back(std::move(c));
  }
  engine::RetentionGuard guard;
  guard.tip_step = listed.front().step;
  guard.lineage = listed.front().manifest.state.lineage;
  guard.rollback_distance = retention.rollback_window;
  guard.held = retention.held;
  std::vector<engine::RetentionVerdict> verdicts =
      engine::PlanRetention(candidates, retention.policy, guard);
  if (!apply) return verdicts;
  for (engine::RetentionVerdict& v : verdicts) {
    if (v.keep) continue;
    if (absl::Status s = DeleteRemoteCheckpoint(client, job, v.checkpoint.step); !s.ok()) {
      v.keep = true;
      v.error = std::string(s.message());
    }
  }
  return verdicts;
}

absl::StatusOr<TransferReport> DownloadCheckpoint(S3Client& client, const RemoteCheckpoint& remote,
                                                  const std::string& dir,
                                                  const TransferOptions& options) {
  const absl::Time start = absl::Now();
  const std::string final_path = absl::StrCat(dir, "/", StepName(remote.step));
  struct stat st;
  if (::stat(final_path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(final_path, " exists: not downloaded again"));
  }
  ASSIGN_OR_RETURN(S3Location at, ParseS3Url(remote.url));
  // A name RemoveTemporaries recognises, so that a crash mid-download
  // leaves nothing a later start keeps.
  const std::string tmp = absl::StrCat(final_path, ".tmp-", ::getpid(), "-remote");
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  std::filesystem::create_directories(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", tmp, ": ", ec.message()));
  auto cleanup = [&](absl::Status s) {
    std::error_code ignored;
    std::filesystem::remove_all(tmp, ignored);
    return s;
  };
  absl::Status s = ForEach(remote.manifest.files.size(), options.threads, [&](size_t i) {
    const ManifestFile& f = remote.manifest.files[i];
    return DownloadFile(client, at, f, tmp + "/" + f.name, options);
  });
  if (!s.ok()) return cleanup(s);
  // The manifest as uploaded (its checksum held when it was listed).
  const std::string manifest = SerializeManifest(remote.manifest);
  {
    const std::string path = tmp + "/" + kManifestFileName;
    Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return cleanup(absl::InternalError(Errno("create " + path)));
    s = WriteFull(fd.get(), manifest, path);
    if (s.ok() && ::fsync(fd.get()) != 0) s = absl::InternalError(Errno("fsync " + path));
    if (!s.ok()) return cleanup(s);
  }
  if (s = FsyncPath(tmp); !s.ok()) return cleanup(s);
  // Never over a step-N that appeared meanwhile.
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) != 0) {
    return cleanup(absl::InternalError(Errno("rename " + tmp + " to " + final_path)));
  }
  RETURN_IF_ERROR(FsyncPath(dir));
  // It is in the store: nothing for a pruner to wait for.
  engine::MarkUploadSettled(final_path);
  TransferReport report;
  report.url = remote.url;
  report.step = remote.step;
  for (const ManifestFile& f : remote.manifest.files) report.bytes += f.bytes;
  report.objects = static_cast<int>(remote.manifest.files.size()) + 1;
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return report;
}

absl::StatusOr<TransferReport> RestoreFromRemote(S3Client& client, const S3Location& job,
                                                 const std::string& dir, int64_t resume_step,
                                                 std::string* note,
                                                 const TransferOptions& options) {
  TransferReport none;
  if (resume_step == 0) {
    *note = "starting from scratch: the object store is not read";
    return none;
  }
  ASSIGN_OR_RETURN(std::vector<RemoteCheckpoint> remote, ListRemoteCheckpoints(client, job));
  const RemoteCheckpoint* want = nullptr;
  for (const RemoteCheckpoint& r : remote) {
    if (resume_step > 0 && r.step > resume_step) continue;
    want = &r;
    break;
  }
  if (want == nullptr) {
    *note = absl::StrCat("no checkpoint in ", job.Url(),
                         resume_step > 0 ? absl::StrCat(" at or before step ", resume_step) : "");
    return none;
  }
  const int64_t want_generation = want->manifest.state.generation;
  for (const engine::CheckpointEntry& e : engine::ListCheckpoints(dir)) {
    if (resume_step > 0 && e.step > resume_step) continue;
    // Lineage order: the first local entry that verifies is the one the
    // choice would take; the remote one is needed only if newer.
    if (e.generation < want_generation ||
        (e.generation == want_generation && e.step < want->step)) {
      break;
    }
    if (engine::VerifyCheckpoint(e).ok()) {
      *note = absl::StrCat("the directory has step ", e.step, " (attempt ", e.generation,
                           "), as new as the object store's newest, step ", want->step);
      return none;
    }
    if (e.step == want->step && !e.legacy) {
      // The same step, damaged here: set aside, replaced by the store's copy.
      const std::string aside = absl::StrCat(e.path, ".tmp-", ::getpid(), "-damaged");
      if (::rename(e.path.c_str(), aside.c_str()) != 0) {
        return absl::InternalError(Errno("rename " + e.path + " to " + aside));
      }
    }
  }
  ASSIGN_OR_RETURN(TransferReport report, DownloadCheckpoint(client, *want, dir, options));
  *note = absl::StrCat("restored step ", report.step, " from ", report.url, " (", report.bytes,
                       " bytes, ", report.objects, " objects, verified, in ",
                       absl::StrFormat("%.2f", report.seconds), " s)");
  return report;
}

absl::StatusOr<std::string> RestoreForResume(const std::string& job_url, const std::string& dir,
                                             int64_t resume_step) {
  absl::StatusOr<S3Location> job = ParseS3Url(job_url);
  absl::StatusOr<S3Config> config = S3ConfigFromEnvironment(ProcessEnvironment());
  absl::Status error = !job.ok() ? job.status() : config.status();
  if (error.ok()) {
    S3Client client(*config);
    std::string note;
    absl::StatusOr<TransferReport> r = RestoreFromRemote(client, *job, dir, resume_step, &note);
    if (r.ok()) return note;
    error = r.status();
  }
  return absl::Status(error.code(),
                      absl::StrCat("nothing restored from ", job_url, " (", error.message(),
                                   "); resuming from ", dir, " alone"));
}

absl::StatusOr<TransferReport> FetchCheckpoint(S3Client& client, absl::string_view url,
                                               const std::string& dir,
                                               const TransferOptions& options) {
  S3Location job;
  ASSIGN_OR_RETURN(const int64_t step, ParseCheckpointUrl(url, &job));
  const S3Location at = RemoteCheckpointLocation(job, step);
  RemoteCheckpoint remote;
  remote.step = step;
  remote.url = at.Url();
  absl::StatusOr<std::string> text = client.GetObject(at.bucket, at.prefix + kManifestFileName);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(remote.url, " has no ", kManifestFileName,
                                            ": no whole checkpoint is there (never uploaded "
                                            "whole, or deleted)"));
  }
  if (!text.ok()) return text.status();
  ASSIGN_OR_RETURN(remote.manifest,
                   ParseManifest(*text, absl::StrCat(remote.url, "/", kManifestFileName)));
  if (remote.manifest.state.step != step) {
    return absl::DataLossError(absl::StrCat(remote.url, "/", kManifestFileName, " says step ",
                                            remote.manifest.state.step));
  }
  const std::string local = engine::CheckpointPath(dir, step);
  struct stat st;
  if (::stat(local.c_str(), &st) == 0) {
    engine::CheckpointEntry here{step, local, remote.manifest.state.generation, false};
    if (engine::VerifyCheckpoint(here).ok()) {
      TransferReport none;
      none.url = remote.url;
      none.step = step;
      return none;  // objects 0: nothing read
    }
    const std::string aside = absl::StrCat(local, ".tmp-", ::getpid(), "-damaged");
    if (::rename(local.c_str(), aside.c_str()) != 0) {
      return absl::InternalError(Errno("rename " + local + " to " + aside));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating ", dir, ": ", ec.message()));
  return DownloadCheckpoint(client, remote, dir, options);
}

absl::StatusOr<std::string> FetchForInit(const std::string& url, const std::string& dir) {
  ASSIGN_OR_RETURN(S3Config config, S3ConfigFromEnvironment(ProcessEnvironment()));
  S3Client client(config);
  ASSIGN_OR_RETURN(TransferReport r, FetchCheckpoint(client, url, dir));
  if (r.objects == 0) {
    return absl::StrCat(engine::CheckpointPath(dir, r.step), " is already a verified copy of ",
                        r.url);
  }
  return absl::StrCat("fetched step ", r.step, " from ", r.url, " (", r.bytes, " bytes, ",
                      r.objects, " objects, verified, in ", absl::StrFormat("%.2f", r.seconds),
                      " s)");
}

}  // namespace loom::object_store
