// Status propagation macros. Debian 12's Abseil (20220623) does not ship
// absl/status/status_macros.h, so Loom keeps this small equivalent.
#ifndef LOOM_COMMON_STATUS_MACROS_H_
#define LOOM_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LOOM_STATUS_CONCAT_INNER_(a, b) a##b
#define LOOM_STATUS_CONCAT_(a, b) LOOM_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status loom_status_ = (expr);          \
    if (!loom_status_.ok()) return loom_status_;   \
  } while (0)

// ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define ASSIGN_OR_RETURN(lhs, expr)                                          \
  auto LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__) = (expr);               \
  if (!LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__).ok())                   \
    return LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__).status();           \
  lhs = std::move(LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__)).value()

#endif  // LOOM_COMMON_STATUS_MACROS_H_
