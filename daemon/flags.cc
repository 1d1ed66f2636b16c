#include "daemon/flags.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/config/config.h"

namespace commd {

const char* DaemonUsage() {
  return R"(Usage: commd [OPTIONS]

Per-node communication daemon for GPU training: shared communication memory, rendezvous,
topology, flight recorder, hang detection and Prometheus metrics for the ranks on this node.
Runs in the foreground (systemd supervises it). Prints "commd ready" once it serves.

Options:
  --config FILE             textproto config (commd.v1.DaemonConfig); only the fields it sets
                            change the embedded defaults
  --runtime-dir DIR         directory for commd.sock, handles.sock and commd.lock
                            (default: /run/commd as root, else $XDG_RUNTIME_DIR/commd,
                            else /tmp/commd-$UID)
  --metrics-address H:P     Prometheus endpoint; port 0 picks a free port (default 0.0.0.0:9464)
  --dump-dir DIR            where flight-recorder dumps go (default: /var/lib/commd/dumps as
                            root, else $XDG_STATE_HOME/commd/dumps)
  --log-level LEVEL         debug, info, warning or error (default info)
  --node-name NAME          this node's name in the cluster (cluster.node_name; needs the
                            config's cluster section), e.g. Kubernetes' node name from the
                            downward API
  --print-default-config    print the full default config, with comments, and exit
  --version                 print the version and exit
  -h, --help                print this help and exit

Flags override the config file. Signals: SIGTERM/SIGINT stop (exit 0), SIGHUP reloads the
log level from the config file, SIGUSR1 dumps every rank's flight recorder.
Clients find the daemon through COMMD_RUNTIME_DIR or the same default runtime dir.
)";
}

absl::StatusOr<DaemonFlags> ParseDaemonFlags(int argc, const char* const* argv) {
  DaemonFlags flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inline_value;
    if (const size_t eq = arg.find('='); absl::StartsWith(arg, "--") && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (inline_value) return *inline_value;
      // "--config --log-level debug" is a forgotten value, not a file named "--log-level".
      if (i + 1 >= argc || absl::StartsWith(argv[i + 1], "--")) {
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      }
      return std::string(argv[++i]);
    };
    auto no_value = [&]() -> absl::Status {
      if (inline_value) return absl::InvalidArgumentError(absl::StrCat(arg, " takes no value"));
      return absl::OkStatus();
    };
    if (arg == "--config") {
      ASSIGN_OR_RETURN(flags.config_path, value());
    } else if (arg == "--runtime-dir") {
      ASSIGN_OR_RETURN(flags.runtime_dir, value());
    } else if (arg == "--metrics-address") {
      ASSIGN_OR_RETURN(flags.metrics_address, value());
    } else if (arg == "--dump-dir") {
      ASSIGN_OR_RETURN(flags.dump_dir, value());
    } else if (arg == "--log-level") {
      ASSIGN_OR_RETURN(flags.log_level, value());
    } else if (arg == "--node-name") {
      ASSIGN_OR_RETURN(flags.node_name, value());
    } else if (arg == "--print-default-config") {
      RETURN_IF_ERROR(no_value());
      flags.print_default_config = true;
    } else if (arg == "--version") {
      RETURN_IF_ERROR(no_value());
      flags.version = true;
    } else if (arg == "-h" || arg == "--help") {
      flags.help = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", arg, "'"));
    }
  }
  return flags;
}

absl::StatusOr<v1::DaemonConfig> ResolveConfig(const DaemonFlags& flags) {
  v1::DaemonConfig config = config::DefaultConfig();
  if (!flags.config_path.empty()) {
    ASSIGN_OR_RETURN(config, config::LoadConfigFile(flags.config_path));
  }
  if (flags.runtime_dir) config.set_runtime_dir(*flags.runtime_dir);
  if (flags.dump_dir) config.mutable_recorder()->set_dump_dir(*flags.dump_dir);
  if (flags.metrics_address) {
    auto hp = config::ParseHostPort(*flags.metrics_address);
    if (!hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics-address: ", hp.status().message()));
    }
    config.set_metrics_address(*flags.metrics_address);
  }
  if (flags.log_level) {
    v1::LogLevel level;
    if (!v1::LogLevel_Parse(absl::AsciiStrToUpper(*flags.log_level), &level) ||
        level == v1::LOG_LEVEL_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--log-level '", *flags.log_level, "' is not one of debug, info, warning, error"));
    }
    config.set_log_level(level);
  }
  if (flags.node_name) {
    if (config.cluster().etcd_endpoints_size() == 0) {
      return absl::InvalidArgumentError(
          "--node-name names this node in a cluster: the config has no cluster section with "
          "cluster.etcd_endpoints");
    }
    if (!ValidateJobId(*flags.node_name).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--node-name ", QuoteForError(*flags.node_name),
                       " must be 1 to 128 of letters, digits and . _ - :"));
    }
    config.mutable_cluster()->set_node_name(*flags.node_name);
  }
  return config;
}

}  // namespace commd
