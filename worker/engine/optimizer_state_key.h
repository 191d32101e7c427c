// The key under which torch::optim::Optimizer::state() holds a parameter's
// state: LibTorch 1.13 keys by the TensorImpl address printed as a string
// (c10::guts::to_string), 2.x by the address itself. Header-only; the
// branch for the installed LibTorch is the only one instantiated.
#ifndef LOOM_WORKER_ENGINE_OPTIMIZER_STATE_KEY_H_
#define LOOM_WORKER_ENGINE_OPTIMIZER_STATE_KEY_H_

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

namespace loom::engine {

using OptimizerStateMap =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using OptimizerStateKey = typename OptimizerStateMap::key_type;

namespace internal {
template <typename Key>
Key StateKeyOf(const torch::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // what c10::guts::to_string(ptr) does in 1.13
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}
}  // namespace internal

// The state() key of `param` in this LibTorch.
inline OptimizerStateKey StateKeyOf(const torch::Tensor& param) {
  return internal::StateKeyOf<OptimizerStateKey>(param);
}

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPTIMIZER_STATE_KEY_H_
