// commd's command line: flags, usage text, and the config they resolve to.
#ifndef COMMD_DAEMON_FLAGS_H_
#define COMMD_DAEMON_FLAGS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "commd/v1/config.pb.h"

namespace commd {

struct DaemonFlags {
  std::string config_path;
  std::optional<std::string> runtime_dir;
  std::optional<std::string> metrics_address;
  std::optional<std::string> dump_dir;
  std::optional<std::string> log_level;
  std::optional<std::string> node_name;  // cluster.node_name
  bool print_default_config = false;
  bool version = false;
  bool help = false;
};

// Accepts "--flag value" and "--flag=value". Unknown flags and stray arguments are errors.
absl::StatusOr<DaemonFlags> ParseDaemonFlags(int argc, const char* const* argv);

const char* DaemonUsage();

// The config file (or the embedded defaults without one) with the flags applied over it.
absl::StatusOr<v1::DaemonConfig> ResolveConfig(const DaemonFlags& flags);

}  // namespace commd

#endif  // COMMD_DAEMON_FLAGS_H_
