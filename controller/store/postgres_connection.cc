#include "controller/store/postgres_connection.h"

#include <libpq-fe.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::controller::store {
namespace {

// Type oids of the integer columns (pg_type.h).
constexpr Oid kInt8Oid = 20;
constexpr Oid kInt2Oid = 21;
constexpr Oid kInt4Oid = 23;

int64_t BigEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  // Sign-extend the narrower types.
  if (n < 8 && n > 0 && (static_cast<unsigned char>(p[0]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
  return static_cast<int64_t>(v);
}

// `?` placeholders numbered $1, $2, ... (none sit inside quotes in Loom's SQL,
// but quoted text is skipped all the same).
std::string Numbered(absl::string_view sql) {
  std::string out;
  out.reserve(sql.size() + 16);
  int n = 0;
  char quote = 0;
  for (char c : sql) {
    if (quote != 0) {
      if (c == quote) quote = 0;
      out.push_back(c);
    } else if (c == '\'' || c == '"') {
      quote = c;
      out.push_back(c);
    } else if (c == '?') {
      absl::StrAppend(&out, "$", ++n);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void IgnoreNotice(void*, const char*) {}

}  // namespace

bool IsPostgresUrl(absl::string_view url) {
  return absl::StartsWith(url, "postgresql://") || absl::StartsWith(url, "postgres://");
}

bool PostgresUrlHasPassword(absl::string_view url) {
  const std::string lower = absl::AsciiStrToLower(url);
  if (absl::StrContains(lower, "password=")) return true;
  const size_t scheme = url.find("://");
  if (scheme == absl::string_view::npos) return false;
  absl::string_view rest = url.substr(scheme + 3);
  rest = rest.substr(0, rest.find_first_of("/?"));
  const size_t at = rest.rfind('@');
  if (at == absl::string_view::npos) return false;
  return rest.substr(0, at).find(':') != absl::string_view::npos;
}

absl::StatusOr<std::unique_ptr<PostgresConnection>> PostgresConnection::Open(
    PostgresOptions options) {
  if (!IsPostgresUrl(options.url)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store URL \"", options.url, "\": expected postgresql://[user@]host[:port]/database"));
  }
  std::unique_ptr<PostgresConnection> conn(new PostgresConnection(std::move(options)));
  absl::Status s = conn->Connect();
  if (!s.ok()) return s;
  return conn;
}

PostgresConnection::~PostgresConnection() { PQfinish(conn_); }

absl::Status PostgresConnection::Connect() {
  if (conn_ != nullptr) PQfinish(conn_);
  statements_.clear();
  const std::string connect_timeout = std::to_string(options_.connect_timeout_seconds);
  const std::string user_timeout = std::to_string(options_.tcp_user_timeout_ms);
  // Loom's defaults first: what the URL says overrides them; the password
  // comes last, from where the caller read it.
  std::vector<const char*> keys = {
      "connect_timeout",     "tcp_user_timeout", "keepalives",       "keepalives_idle",
      "keepalives_interval", "keepalives_count", "application_name", "dbname"};
  std::vector<const char*> values = {
      connect_timeout.c_str(), user_timeout.c_str(), "1", "1", "1", "2",
      "loom-controller",       options_.url.c_str()};
  if (!options_.password.empty()) {
    keys.push_back("password");
    values.push_back(options_.password.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  conn_ = PQconnectdbParams(keys.data(), values.data(), /*expand_dbname=*/1);
  if (conn_ == nullptr) return absl::ResourceExhaustedError("store: libpq: out of memory");
  if (PQstatus(conn_) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(conn_);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    broken_ = true;
    const std::string text =
        absl::StrCat("store: cannot connect to PostgreSQL at ", options_.url, ": ", msg);
    // Credentials the server refuses will not get better by waiting.
    if (absl::StrContains(msg, "authentication failed") ||
        absl::StrContains(msg, "no password supplied")) {
      return absl::PermissionDeniedError(text);
    }
    if (absl::StrContains(msg, "does not exist")) return absl::FailedPreconditionError(text);
    return absl::UnavailableError(text);
  }
  PQsetNoticeProcessor(conn_, IgnoreNotice, nullptr);
  std::string limits;
  if (options_.idle_in_transaction_timeout_ms > 0) {
    absl::StrAppend(&limits, "SET idle_in_transaction_session_timeout = ",
                    options_.idle_in_transaction_timeout_ms, ";");
  }
  if (options_.lock_timeout_ms > 0) {
    absl::StrAppend(&limits, "SET lock_timeout = ", options_.lock_timeout_ms, ";");
  }
  if (!limits.empty()) {
    PGresult* res = PQexec(conn_, limits.c_str());
    const bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    std::string msg = ok ? "" : PQresultErrorMessage(res);
    PQclear(res);
    if (!ok) {
      broken_ = true;
      return absl::UnavailableError(absl::StrCat("store: setting session limits: ", msg));
    }
  }
  const char* host = PQhost(conn_);
  describe_ = absl::StrCat("PostgreSQL database ", PQdb(conn_), " on ", host ? host : "?", ":",
                           PQport(conn_));
  broken_ = false;
  in_transaction_ = false;
  return absl::OkStatus();
}

absl::Status PostgresConnection::Ready(bool is_rollback) {
  if (!broken_) return absl::OkStatus();
  if (in_transaction_) {
    if (is_rollback) return absl::OkStatus();  // the server dropped it with the connection
    return absl::UnavailableError(
        absl::StrCat("store: the connection to ", describe_, " was lost inside a transaction"));
  }
  return Connect();
}

absl::Status PostgresConnection::ErrorOf(const void* result, absl::string_view what) {
  const PGresult* res = static_cast<const PGresult*>(result);
  std::string msg = res != nullptr ? PQresultErrorMessage(res) : PQerrorMessage(conn_);
  if (msg.empty()) msg = PQerrorMessage(conn_);
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  const char* state = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  if (PQstatus(conn_) != CONNECTION_OK) broken_ = true;
  // Class 08 (connection exception) and 57P0x (the server shutting down or
  // restarting) mean try again; the rest is a fault in the request.
  // 55P03: a lock not granted within lock_timeout; 25P03: this session was
  // idle in its transaction too long and the server ended it.
  const bool unavailable = broken_ || state == nullptr || absl::StartsWith(state, "08") ||
                           absl::StartsWith(state, "57P") || std::string(state) == "55P03" ||
                           std::string(state) == "25P03";
  const std::string text = absl::StrCat("store: ", what, " on ", describe_, ": ", msg);
  return unavailable ? absl::UnavailableError(text) : absl::InternalError(text);
}

absl::Status PostgresConnection::Exec(absl::string_view script) {
  const bool rollback = absl::StartsWith(script, "ROLLBACK");
  if (absl::Status s = Ready(rollback); !s.ok()) return s;
  if (broken_ && rollback) {
    in_transaction_ = false;
    return absl::OkStatus();
  }
  PGresult* res = PQexec(conn_, std::string(script).c_str());
  const ExecStatusType st = PQresultStatus(res);
  absl::Status s = absl::OkStatus();
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    s = ErrorOf(res, absl::StrCat("\"", script.substr(0, 40), "\""));
  }
  PQclear(res);
  if (absl::StartsWith(script, "BEGIN")) {
    in_transaction_ = s.ok();
  } else if (rollback || absl::StartsWith(script, "COMMIT")) {
    in_transaction_ = false;
  }
  return s;
}

absl::StatusOr<SqlResult> PostgresConnection::Run(absl::string_view sql,
                                                  std::initializer_list<SqlParam> params) {
  if (absl::Status s = Ready(false); !s.ok()) return s;
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    const std::string name = absl::StrCat("loom_", statements_.size() + 1);
    PGresult* res = PQprepare(conn_, name.c_str(), Numbered(sql).c_str(), 0, nullptr);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      absl::Status s = ErrorOf(res, absl::StrCat("prepare \"", sql.substr(0, 60), "\""));
      PQclear(res);
      return s;
    }
    PQclear(res);
    it = statements_.emplace(std::string(sql), name).first;
  }
  const int n = static_cast<int>(params.size());
  std::vector<std::string> ints(n);
  std::vector<const char*> values(n);
  std::vector<int> lengths(n), formats(n);
  int i = 0;
  for (const SqlParam& p : params) {
    if (p.kind == SqlParam::Kind::kInt) {
      ints[i] = std::to_string(p.i);
      values[i] = ints[i].c_str();
      lengths[i] = static_cast<int>(ints[i].size());
      formats[i] = 0;
    } else {
      // Text as text: it carries no NUL. Blobs as binary bytea.
      values[i] = p.s.data();
      lengths[i] = static_cast<int>(p.s.size());
      formats[i] = p.kind == SqlParam::Kind::kBlob ? 1 : 0;
      if (p.kind == SqlParam::Kind::kText) {
        ints[i] = std::string(p.s);  // text parameters must end in NUL
        values[i] = ints[i].c_str();
      }
    }
    ++i;
  }
  PGresult* res = PQexecPrepared(conn_, it->second.c_str(), n, values.data(), lengths.data(),
                                 formats.data(), /*resultFormat=*/1);
  const ExecStatusType st = PQresultStatus(res);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    absl::Status s = ErrorOf(res, absl::StrCat("run \"", sql.substr(0, 60), "\""));
    PQclear(res);
    return s;
  }
  SqlResult result;
  const int rows = PQntuples(res);
  const int columns = PQnfields(res);
  result.rows.reserve(rows);
  for (int r = 0; r < rows; ++r) {
    SqlRow row(columns);
    for (int c = 0; c < columns; ++c) {
      if (PQgetisnull(res, r, c)) continue;
      const char* v = PQgetvalue(res, r, c);
      const int len = PQgetlength(res, r, c);
      const Oid type = PQftype(res, c);
      if (type == kInt8Oid || type == kInt4Oid || type == kInt2Oid) {
        row[c].i = BigEndian(v, len);
      } else {
        row[c].s.assign(v, len);
      }
    }
    result.rows.push_back(std::move(row));
  }
  const char* affected = PQcmdTuples(res);
  result.affected = (affected != nullptr && *affected != '\0') ? std::atoll(affected) : 0;
  PQclear(res);
  return result;
}

}  // namespace loom::controller::store
