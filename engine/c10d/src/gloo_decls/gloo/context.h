// See ../README.md: ProcessGroupGloo.hpp holds a gloo::Context only behind std::shared_ptr; its
// inline setTimeout (which the shim never calls) names Context::setTimeout.
#pragma once

#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
} // namespace gloo
