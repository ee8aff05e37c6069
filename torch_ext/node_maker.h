// The torch-version shim for making autograd nodes: torch holds them by
// std::shared_ptr up to 2.12 and by c10::intrusive_ptr since, and
// Edge::function names the one this build has.
#ifndef FP8KIT_TORCH_EXT_NODE_MAKER_H_
#define FP8KIT_TORCH_EXT_NODE_MAKER_H_

#include <memory>

#include "torch_includes.h"

namespace fp8kit_torch {

using NodePtr = decltype(torch::autograd::Edge::function);

// NodeMaker<T>::make(): a new node T held the way this torch holds nodes.
template <typename T, typename P = NodePtr>
struct NodeMaker;
template <typename T>
struct NodeMaker<T, std::shared_ptr<torch::autograd::Node>> {
  static std::shared_ptr<T> make() { return std::make_shared<T>(); }
};
template <typename T>
struct NodeMaker<T, c10::intrusive_ptr<torch::autograd::Node>> {
  static c10::intrusive_ptr<T> make() { return c10::make_intrusive<T>(); }
};

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_NODE_MAKER_H_
