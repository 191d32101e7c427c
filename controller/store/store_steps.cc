// Store: reading a job's step series in ranges (charts: GetStepSeries).
#include <limits>

#include "absl/strings/str_cat.h"
#include "controller/store/store.h"

namespace loom::controller {
namespace {

using store::Int;
using store::Text;

}  // namespace

absl::StatusOr<std::pair<int64_t, int64_t>> Store::StepBounds(const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run(
      "SELECT COALESCE(MIN(step), 0), COALESCE(MAX(step), -1) FROM step_metrics WHERE job_id = ?;",
      {Text(job_id)});
  if (!r.ok()) return r.status();
  return std::make_pair(r->rows[0][0].i, r->rows[0][1].i);
}

absl::Status Store::ScanStepMetrics(const std::string& job_id, int64_t from_step, int64_t to_step,
                                    const std::function<void(const loom::v1::StepMetrics&)>& fn,
                                    int chunk_rows) {
  if (chunk_rows < 1) return absl::InvalidArgumentError("chunk_rows: must be >= 1");
  const std::string row_id = conn_->StepRowId();
  // "After (step, row)" is written with `step >= ?` outside the OR: with
  // bound values SQLite's planner cannot start a range at an OR, and
  // scanned the job's index from its first step for every chunk (a
  // million-step job took 18 s instead of 1).
  const std::string query = absl::StrCat(
      "SELECT step, ", row_id, ", metrics FROM step_metrics WHERE job_id = ? AND step <= ? AND ",
      "step >= ? AND (step > ? OR ", row_id, " > ?) ORDER BY step, ", row_id, " LIMIT ?;");
  // Where the last chunk ended: (step, row id), the next starts after it.
  int64_t step = from_step - 1, row = std::numeric_limits<int64_t>::max();
  for (;;) {
    absl::StatusOr<store::SqlResult> r;
    {
      // One chunk per hold of the connection: a long scan lets the
      // group commit in between chunks.
      WatchedLock lock(mu_, __func__);
      r = conn_->Run(query,
                     {Text(job_id), Int(to_step), Int(step), Int(step), Int(row), Int(chunk_rows)});
    }
    if (!r.ok()) return r.status();
    loom::v1::StepMetrics m;
    for (const store::SqlRow& cells : r->rows) {
      if (!m.ParseFromString(cells[2].s)) {
        return absl::DataLossError("store: step metrics row is corrupt");
      }
      fn(m);
    }
    if (static_cast<int>(r->rows.size()) < chunk_rows) return absl::OkStatus();
    step = r->rows.back()[0].i;
    row = r->rows.back()[1].i;
  }
}

}  // namespace loom::controller
