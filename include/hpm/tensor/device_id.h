// Which kind of device a tensor lives on and which one of that kind: "cpu", "cuda:1".
#pragma once
#include <cstdint>
#include <string>

namespace hpm {

// kPrivateUse is a slot for a backend built outside the tree or in a test (PyTorch's PrivateUse1):
// the conformance test registers the CPU backend under it as a second device type.
enum class DeviceType : std::uint8_t { kCpu, kCuda, kPrivateUse };
inline constexpr int kDeviceTypes = 3;

const char* device_type_name(DeviceType type);

struct DeviceId {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  // "cpu" (there is one), "cuda:0", "private:0".
  std::string str() const;
  bool operator==(const DeviceId&) const = default;
};

// "cpu", "cuda" (cuda:0) or "cuda:N"; throws std::invalid_argument quoting the text otherwise.
DeviceId parse_device_id(const std::string& text);

}  // namespace hpm
