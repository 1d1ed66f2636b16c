// A raw gRPC caller of the daemon's socket, with no commd session: what a client that never
// authenticates (or makes a token up) gets.
//
//   auto stub = v1::Node::NewStub(RawChannel(daemon->runtime_dir()));
//   EXPECT_EQ(UnauthenticatedProblems([&](grpc::ClientContext& ctx) {
//               v1::NodeStatus out;
//               return stub->GetStatus(&ctx, {}, &out);
//             }), "");
#ifndef COMMD_TESTS_INTEGRATION_RAW_GRPC_H_
#define COMMD_TESTS_INTEGRATION_RAW_GRPC_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace commd::testing {

inline std::shared_ptr<grpc::Channel> RawChannel(const std::string& runtime_dir) {
  return grpc::CreateChannel(absl::StrCat("unix:", runtime_dir, "/commd.sock"),
                             grpc::InsecureChannelCredentials());
}

// Makes `call` twice, with no session token and with a made-up one; "" when both got
// UNAUTHENTICATED saying "no session token" / "unknown", else what went wrong.
inline std::string UnauthenticatedProblems(
    const std::function<grpc::Status(grpc::ClientContext&)>& call) {
  std::string problems;
  for (const std::string token : {"", "0123456789abcdef0123456789abcdef"}) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("commd-session", token);
    const grpc::Status s = call(ctx);
    const char* want = token.empty() ? "no session token" : "unknown";
    if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED ||
        !absl::StrContains(s.error_message(), want)) {
      absl::StrAppend(&problems, "token \"", token, "\": code ", static_cast<int>(s.error_code()),
                      " \"", s.error_message(), "\" (want UNAUTHENTICATED with \"", want, "\"); ");
    }
  }
  return problems;
}

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_RAW_GRPC_H_
