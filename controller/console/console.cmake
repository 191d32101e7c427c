# Included from controller/controller.cmake: paths are relative to this file.
set(_dir ${CMAKE_CURRENT_LIST_DIR})
# Loom Console: its JSON API over the controller's own gRPC services, and
# the HTTP(S) listener that serves it (cpp-httplib, Debian's build of it with
# OpenSSL). tests/console_api_test.cc drives both in a real controller.
find_package(OpenSSL REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# The pages, compiled in.
set(_assets index.html console.js core.js chart.js job_page.js console.css favicon.svg)
set(_assets_paths "")
foreach(_a ${_assets})
  list(APPEND _assets_paths ${_dir}/assets/${_a})
endforeach()
string(REPLACE ";" "," _assets_names "${_assets}")
set(_assets_cc ${CMAKE_CURRENT_BINARY_DIR}/console_assets.cc)
add_custom_command(
  OUTPUT ${_assets_cc}
  COMMAND ${CMAKE_COMMAND} -DOUT=${_assets_cc} -DDIR=${_dir}/assets -DNAMES=${_assets_names}
          -P ${_dir}/embed_assets.cmake
  DEPENDS ${_assets_paths} ${_dir}/embed_assets.cmake
  COMMENT "embedding the console's pages")
loom_library(loom_console SRCS ${_assets_cc} ${_dir}/api_gateway.cc ${_dir}/query_params.cc ${_dir}/console_server.cc ${_dir}/sessions.cc ${_dir}/event_stream.cc
  DEPS loom_leader loom_store loom_proto loom_grpc loom_grpc_util loom_sha256 loom_common PkgConfig::CPP_HTTPLIB OpenSSL::SSL
       OpenSSL::Crypto absl::strings absl::time)
loom_test(loom_api_gateway_test SRCS ${_dir}/api_gateway_test.cc DEPS loom_console)
loom_test(loom_query_params_test SRCS ${_dir}/query_params_test.cc DEPS loom_console)
loom_test(loom_console_sessions_test SRCS ${_dir}/sessions_test.cc DEPS loom_console)
loom_test(loom_event_stream_test SRCS ${_dir}/event_stream_test.cc DEPS loom_console)
loom_test(loom_console_server_test SRCS ${_dir}/console_server_test.cc DEPS loom_console)
