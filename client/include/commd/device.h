// Where memory lives: host memory or a CUDA device.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_DEVICE_H_
#define COMMD_CLIENT_INCLUDE_COMMD_DEVICE_H_

#include <string>

namespace commd {

class Device {
 public:
  static Device Host() { return Device(-1); }
  static Device Cuda(int index) { return Device(index); }
  bool is_host() const { return index_ < 0; }
  int cuda_index() const { return index_; }  // -1 for host
  // "host" or "cuda:N", as the daemon spells devices.
  std::string ToString() const { return is_host() ? "host" : "cuda:" + std::to_string(index_); }
  bool operator==(const Device&) const = default;

 private:
  explicit Device(int index) : index_(index) {}
  int index_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_DEVICE_H_
