// Store: opening a store (an SQLite directory under its lock, or a
// PostgreSQL database), its connections and its end.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "controller/store/migrations.h"
#include "controller/store/sqlite_connection.h"
#include "controller/store/store.h"

namespace loom::controller {

namespace {

// Takes `<dir>/LOCK` exclusively; returns its descriptor. flock locks belong
// to the open file description, so a second open in the same process
// conflicts too.
absl::StatusOr<int> LockDirectory(const std::string& dir) {
  const std::string path = dir + "/LOCK";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("state directory ", dir, " is in use by another loom-controller",
                       pid.empty() ? "" : absl::StrCat(" (pid ", pid, ")"),
                       "; stop it first, or give this one its own --data_dir"));
    }
    return absl::UnavailableError(absl::StrCat("cannot lock ", path, ": ", std::strerror(err)));
  }
  const std::string me = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The lock holds either way; the pid is only for the message above.
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir) {
  absl::StatusOr<int> lock_fd = LockDirectory(dir);
  if (!lock_fd.ok()) return lock_fd.status();
  auto conn = store::SqliteConnection::Open(dir + "/loom.db");
  if (!conn.ok()) {
    close(*lock_fd);
    return conn.status();
  }
  return Init(
      *std::move(conn), *lock_fd,
      [path = dir + "/loom.db"]() -> absl::StatusOr<std::unique_ptr<store::SqlConnection>> {
        return store::SqliteConnection::Open(path);
      },
      /*lease_connection=*/false);
}

absl::StatusOr<std::unique_ptr<Store>> Store::OpenPostgres(store::PostgresOptions options) {
  auto conn = store::PostgresConnection::Open(options);
  if (!conn.ok()) return conn.status();
  return Init(
      *std::move(conn), -1,
      [options]() -> absl::StatusOr<std::unique_ptr<store::SqlConnection>> {
        return store::PostgresConnection::Open(options);
      },
      /*lease_connection=*/true);
}

absl::StatusOr<std::unique_ptr<Store>> Store::Init(
    std::unique_ptr<store::SqlConnection> conn, int lock_fd,
    const std::function<absl::StatusOr<std::unique_ptr<store::SqlConnection>>()>& open_other,
    bool lease_connection) {
  // The store owns the lock from here: its destructor releases it.
  std::unique_ptr<Store> store(new Store(std::move(conn), lock_fd));
  absl::Status s = store::Migrate(*store->conn_);
  if (!s.ok()) return s;
  auto reader = open_other();
  if (!reader.ok()) return reader.status();
  store->reader_ = *std::move(reader);
  if (lease_connection) {
    auto lease = open_other();
    if (!lease.ok()) return lease.status();
    store->lease_conn_ = *std::move(lease);
  }
  return store;
}

Store::Store(std::unique_ptr<store::SqlConnection> conn, int lock_fd)
    : conn_(std::move(conn)), dialect_(conn_->dialect()), lock_fd_(lock_fd) {}

Store::~Store() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  durable_cv_.notify_all();
  if (committer_.joinable()) committer_.join();
  reader_.reset();
  lease_conn_.reset();
  conn_.reset();
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the directory
}

}  // namespace loom::controller
