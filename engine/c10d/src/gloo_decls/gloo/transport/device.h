// See ../../README.md: ProcessGroupGloo.hpp holds these only behind std::shared_ptr/unique_ptr.
#pragma once

namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
} // namespace transport
} // namespace gloo
