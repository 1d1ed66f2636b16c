// Debian 12's libgloo-dev (0.0~git20220518) installs gloo/transport/tcp/pair.h but not the
// gloo/common/memory.h it includes. span_agreement.cc needs tcp/pair.h only to name
// Pair::signalExceptionExternal (see Fail there); these stand-ins for the two pointer
// templates the header names let it compile. Nothing here is instantiated or called: no
// object of these types is made or touched by the SDK. On this include path for
// span_agreement.cc only (client/CMakeLists.txt, client/BUILD.bazel).
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr {
  std::weak_ptr<T> ptr_;
};

template <typename T>
class NonOwningPtr {
  std::shared_ptr<T> ptr_;
};

}  // namespace gloo
