// The console's pages (HTML, one JavaScript module, CSS), compiled into the
// controller from controller/console/assets/ (embed_assets.cmake), so that
// a controller serves them with no file to install and the page asks
// nothing of any other origin.
#ifndef LOOM_CONTROLLER_CONSOLE_CONSOLE_ASSETS_H_
#define LOOM_CONTROLLER_CONSOLE_CONSOLE_ASSETS_H_

#include <cstddef>
#include <vector>

namespace loom::controller::console {

struct ConsoleAsset {
  const char* name;          // "console.js": served as /assets/<name>
  const char* content_type;  // "text/javascript; charset=utf-8"
  const unsigned char* data;
  size_t size;
};

// Every asset; index.html is the shell of every page.
const std::vector<ConsoleAsset>& ConsoleAssets();

}  // namespace loom::controller::console

#endif  // LOOM_CONTROLLER_CONSOLE_CONSOLE_ASSETS_H_
