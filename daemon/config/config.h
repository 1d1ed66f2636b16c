// The daemon's configuration: the embedded defaults, a config file over them, validation.
//
//   ASSIGN_OR_RETURN(commd::v1::DaemonConfig config, LoadConfigFile("/etc/commd/commd.textproto"));
//
// A file names only what it changes; every other field keeps its default (fields are proto3
// `optional`, so an explicit 0 or "" in a file is honoured). Errors name the file, the line
// and the field, and for a value out of range the range allowed. Thread-compatible.
#ifndef COMMD_DAEMON_CONFIG_CONFIG_H_
#define COMMD_DAEMON_CONFIG_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "commd/v1/config.pb.h"

namespace commd::config {

// The text of deploy/commd.textproto, embedded at build time, comments included.
absl::string_view DefaultConfigText();

// The embedded defaults, parsed.
v1::DaemonConfig DefaultConfig();

// Parses `text` over the defaults and validates the result. `source` names the text in
// errors (usually the file path).
absl::StatusOr<v1::DaemonConfig> ParseConfig(absl::string_view text, absl::string_view source);

// Reads `path` and parses it as ParseConfig does. A missing or unreadable file is an error.
absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path);

struct HostPort {
  std::string host;
  int port = 0;
};

// Splits "HOST:PORT" (host may be a [v6] literal); port 0..65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

}  // namespace commd::config

#endif  // COMMD_DAEMON_CONFIG_CONFIG_H_
