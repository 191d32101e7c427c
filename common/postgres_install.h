// Where this machine's PostgreSQL server programs are (initdb, postgres):
// for the servers Loom starts itself, `loomctl local up --ha` and the
// tests' (controllers only connect, through libpq).
#ifndef LOOM_COMMON_POSTGRES_INSTALL_H_
#define LOOM_COMMON_POSTGRES_INSTALL_H_

#include <string>

namespace loom {

// $LOOM_PG_BINDIR when set; else the newest /usr/lib/postgresql/<version>/bin
// holding an executable `postgres` (Debian's layout); "" when there is none.
std::string PostgresBinDir();

}  // namespace loom

#endif  // LOOM_COMMON_POSTGRES_INSTALL_H_
