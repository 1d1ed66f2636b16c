// Where a daemon's sockets live, by the rules both the daemon and its clients follow.
#ifndef COMMD_COMMON_RUNTIME_DIR_H_
#define COMMD_COMMON_RUNTIME_DIR_H_

#include <string>

namespace commd {

inline constexpr char kGrpcSocketName[] = "commd.sock";
inline constexpr char kHandleSocketName[] = "handles.sock";
inline constexpr char kLockFileName[] = "commd.lock";
// gRPC metadata key carrying the session token.
inline constexpr char kSessionMetadataKey[] = "commd-session";

// /run/commd as root, else $XDG_RUNTIME_DIR/commd, else /tmp/commd-$UID.
std::string DefaultRuntimeDir();

// The runtime dir a client uses: `explicit_dir` if set, else $COMMD_RUNTIME_DIR, else
// DefaultRuntimeDir().
std::string ClientRuntimeDir(const std::string& explicit_dir);

}  // namespace commd

#endif  // COMMD_COMMON_RUNTIME_DIR_H_
