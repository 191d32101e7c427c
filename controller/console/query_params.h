// The console API's query strings: "a=1&b=x%20y" read into a request
// message's scalar fields, by their proto or JSON names.
#ifndef LOOM_CONTROLLER_CONSOLE_QUERY_PARAMS_H_
#define LOOM_CONTROLLER_CONSOLE_QUERY_PARAMS_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace loom::controller::console {

// Sets `message`'s scalar fields from a query string (repeated fields take
// every occurrence; enums by name or number); INVALID_ARGUMENT naming the
// parameter for an unknown field, a message field, a broken %-escape, or a
// value of the wrong type.
absl::Status ParseQueryParams(const std::string& query, google::protobuf::Message* message);

}  // namespace loom::controller::console

#endif  // LOOM_CONTROLLER_CONSOLE_QUERY_PARAMS_H_
