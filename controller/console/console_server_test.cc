#include "controller/console/console_server.h"

#include <gtest/gtest.h>

namespace loom::controller::console {
namespace {

// Origins as browsers send them in an Origin header: what a console URL is
// compared with before a page of another console may call this one.
TEST(ConsoleOriginTest, IsWhatABrowserSendsForTheUrl) {
  EXPECT_EQ(ConsoleOrigin("https://127.0.0.1:7443"), "https://127.0.0.1:7443");
  EXPECT_EQ(ConsoleOrigin("https://127.0.0.1:7443/"), "https://127.0.0.1:7443");
  EXPECT_EQ(ConsoleOrigin("HTTPS://Loom.Example.COM"), "https://loom.example.com");
  EXPECT_EQ(ConsoleOrigin("https://loom.example.com:443"), "https://loom.example.com");
  EXPECT_EQ(ConsoleOrigin("http://loom.example.com:80"), "http://loom.example.com");
  EXPECT_EQ(ConsoleOrigin("http://loom.example.com:443"), "http://loom.example.com:443");
  EXPECT_EQ(ConsoleOrigin("https://[::1]:7443"), "https://[::1]:7443");
}

TEST(ConsoleOriginTest, RefusesWhatNoOriginIs) {
  for (const char* bad :
       {"", "loom.example.com", "ftp://loom.example.com", "https://",
        "https://loom.example.com/console", "https://loom.example.com?x=1",
        "https://user@loom.example.com", "https://a b", "https://a;script-src *", "null"}) {
    EXPECT_EQ(ConsoleOrigin(bad), "") << bad;
  }
}

}  // namespace
}  // namespace loom::controller::console
