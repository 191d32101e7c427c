// The controller database's schema, as numbered migrations applied in order
// at start-up (table schema_migrations records each with its time).
//
// Version 1 is the catalogs every Loom before PostgreSQL support kept in SQLite (a
// SQLite file from then has no schema_migrations table: its tables are
// brought up to version 1 in place, columns added since included); version
// 2 adds the leader lease, version 3 the jobs' change sequence, 4 the event log, 5 rank logs, 6
// console sessions and URLs. A migration never changes once released: a new one is added at the
// end.
#ifndef LOOM_CONTROLLER_STORE_MIGRATIONS_H_
#define LOOM_CONTROLLER_STORE_MIGRATIONS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "controller/store/sql_connection.h"

namespace loom::controller::store {

// The newest schema version this build knows.
int64_t LatestSchemaVersion();

// Applies the migrations the database lacks, in one transaction (two
// controllers starting together on one PostgreSQL database take turns: the
// second finds the work done). Fails with FAILED_PRECONDITION, changing
// nothing, when the database's schema is newer than this build knows (a
// newer controller wrote it).
absl::Status Migrate(SqlConnection& conn);

// The version recorded in the database (0 for none).
absl::StatusOr<int64_t> SchemaVersion(SqlConnection& conn);

}  // namespace loom::controller::store

#endif  // LOOM_CONTROLLER_STORE_MIGRATIONS_H_
