// What a session may and may not do, seen from raw peers of the daemon's two sockets: import
// tokens (single use, bound to a process, expiring), the Attach stream, and the limits.
#include <sys/socket.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "commd/commd.h"
#include "commd/v1/groups.grpc.pb.h"
#include "commd/v1/handles.pb.h"
#include "commd/v1/session.grpc.pb.h"
#include "common/status_macros.h"
#include "common/unix_socket.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] = R"(
session { import_token_ttl_ms: 300 }
limits { max_sessions: 6 max_groups: 2 max_allocations_per_session: 3 }
)";

// A session opened by hand: the fd-channel connection, its token, and gRPC stubs.
struct RawSession {
  UniqueFd handles;
  std::string token;
  std::unique_ptr<v1::Groups::Stub> groups;
  std::unique_ptr<v1::Session::Stub> session;

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("commd-session", token);
    return ctx;
  }
  // Exchanges one fd-channel request; returns the answer and the fds it carried.
  v1::HandleResponse Exchange(const v1::HandleRequest& request, std::vector<UniqueFd>* fds) {
    EXPECT_TRUE(SendMessage(handles.get(), request.SerializeAsString()).ok());
    auto received = ReceiveMessage(handles.get(), 65536);
    v1::HandleResponse response;
    if (!received.ok() || !received->has_value()) {
      response.set_code(-1);
      return response;
    }
    response.ParseFromString((*received)->bytes);
    if (fds != nullptr) *fds = std::move((*received)->fds);
    return response;
  }
  v1::HandleResponse Import(const std::string& token, std::vector<UniqueFd>* fds) {
    v1::HandleRequest request;
    request.mutable_import()->add_tokens(token);
    return Exchange(request, fds);
  }
};

class SessionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = StartDaemonWithConfig(tmp_, kConfig);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    channel_ = grpc::CreateChannel(absl::StrCat("unix:", daemon_->runtime_dir(), "/commd.sock"),
                                   grpc::InsecureChannelCredentials());
  }

  absl::StatusOr<RawSession> Open(const std::string& job = "job") {
    RawSession s;
    ASSIGN_OR_RETURN(s.handles,
                     ConnectUnix(daemon_->runtime_dir() + "/handles.sock", SOCK_SEQPACKET));
    v1::HandleRequest request;
    request.mutable_open_session()->set_job_id(job);
    v1::HandleResponse response = s.Exchange(request, nullptr);
    if (response.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
    }
    s.token = response.open_session().session_token();
    s.groups = v1::Groups::NewStub(channel_);
    s.session = v1::Session::NewStub(channel_);
    return s;
  }

  // Joins a one-rank group.
  v1::JoinGroupResponse JoinAlone(RawSession& s, const std::string& name) {
    v1::JoinGroupRequest request;
    request.set_name(name);
    request.set_rank(0);
    request.set_world_size(1);
    v1::JoinGroupResponse response;
    const grpc::Status status = s.groups->JoinGroup(s.Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(SessionsTest, ImportTokensAreSingleUse) {
  auto s = Open();
  ASSERT_TRUE(s.ok()) << s.status();
  const v1::BufferHandle handle = JoinAlone(*s, "g").control_block();
  std::vector<UniqueFd> fds;
  v1::HandleResponse first = s->Import(handle.import_token(), &fds);
  ASSERT_EQ(first.code(), 0) << first.message();
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(first.import().sizes(0), handle.mapped_bytes());
  v1::HandleResponse again = s->Import(handle.import_token(), &fds);
  EXPECT_EQ(again.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(again.message(), HasSubstr("already used"));
  EXPECT_TRUE(fds.empty());
}

TEST_F(SessionsTest, ImportTokensAreBoundToTheAskingProcess) {
  auto s = Open();
  ASSERT_TRUE(s.ok());
  const v1::BufferHandle handle = JoinAlone(*s, "g").control_block();
  ProcessResult other =
      RunProcess({COMMD_TEST_CLIENT, "import", handle.import_token()}, absl::Seconds(30),
                 {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir()});
  EXPECT_THAT(other.output, HasSubstr("refused 5"));  // NOT_FOUND
  EXPECT_THAT(other.output, HasSubstr("(0 fds)"));
  // The rightful process can still redeem it: the stranger's attempt consumed nothing.
  std::vector<UniqueFd> fds;
  EXPECT_EQ(s->Import(handle.import_token(), &fds).code(), 0);
  EXPECT_EQ(fds.size(), 1u);
}

TEST_F(SessionsTest, ImportTokensExpire) {
  auto s = Open();
  ASSERT_TRUE(s.ok());
  const v1::BufferHandle handle = JoinAlone(*s, "g").control_block();
  absl::SleepFor(absl::Milliseconds(600));  // import_token_ttl_ms: 300
  std::vector<UniqueFd> fds;
  v1::HandleResponse late = s->Import(handle.import_token(), &fds);
  EXPECT_EQ(late.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(fds.empty());
}

TEST_F(SessionsTest, BadImportRequests) {
  auto s = Open();
  ASSERT_TRUE(s.ok());
  v1::HandleRequest none;
  none.mutable_import();
  v1::HandleResponse r = s->Exchange(none, nullptr);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.message(), HasSubstr("import of 0 tokens; allowed 1 to 16"));
  v1::HandleRequest many;
  for (int i = 0; i < 17; ++i) many.mutable_import()->add_tokens("x");
  r = s->Exchange(many, nullptr);
  EXPECT_THAT(r.message(), HasSubstr("import of 17 tokens"));
  // A forged token fails the whole request; nothing leaks through for the good one.
  const v1::BufferHandle handle = JoinAlone(*s, "g").control_block();
  v1::HandleRequest mixed;
  mixed.mutable_import()->add_tokens(handle.import_token());
  mixed.mutable_import()->add_tokens("00000000000000000000000000000000");
  std::vector<UniqueFd> fds;
  r = s->Exchange(mixed, &fds);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(fds.empty());
}

TEST_F(SessionsTest, AttachStreamGreetsOnceAndItsEndEndsTheSession) {
  auto s = Open();
  ASSERT_TRUE(s.ok());
  auto ctx = s->Context();
  auto reader = s->session->Attach(ctx.get(), v1::AttachRequest());
  v1::SessionEvent event;
  ASSERT_TRUE(reader->Read(&event));
  ASSERT_TRUE(event.has_attached());
  EXPECT_EQ(event.attached().job_id(), "job");
  EXPECT_EQ(event.attached().pid(), ::getpid());

  auto second_ctx = s->Context();
  auto second = s->session->Attach(second_ctx.get(), v1::AttachRequest());
  EXPECT_FALSE(second->Read(&event));
  EXPECT_EQ(second->Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);

  EXPECT_EQ(Metric("commd_sessions"), 1);
  ctx->TryCancel();
  reader->Finish();
  for (int i = 0; i < 100 && Metric("commd_sessions") != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Metric("commd_sessions"), 0);
  // The token died with the session.
  v1::JoinGroupRequest request;
  request.set_name("g");
  request.set_world_size(1);
  v1::JoinGroupResponse response;
  EXPECT_EQ(s->groups->JoinGroup(s->Context().get(), request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SessionsTest, LimitsAreResourceExhaustedNamingTheirField) {
  std::vector<RawSession> sessions;
  absl::Status last;
  for (int i = 0; i < 7 && last.ok(); ++i) {
    auto s = Open();
    last = s.status();
    if (s.ok()) sessions.push_back(std::move(*s));
  }
  EXPECT_EQ(sessions.size(), 6u);
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(last.message(), HasSubstr("limits.max_sessions"));

  const uint64_t group_a = JoinAlone(sessions[0], "a").group_id();
  JoinAlone(sessions[1], "b");
  v1::JoinGroupRequest third;
  third.set_name("c");
  third.set_world_size(1);
  v1::JoinGroupResponse response;
  grpc::Status status =
      sessions[2].groups->JoinGroup(sessions[2].Context().get(), third, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("limits.max_groups"));

  // Session 0 holds its control block; two symmetric buffers reach its limit of 3.
  v1::AllocateSymmetricRequest alloc;
  alloc.set_group_id(group_a);
  alloc.set_bytes(4096);
  for (int i = 0; i < 2; ++i) {
    v1::SymmetricAllocation out;
    status = sessions[0].groups->AllocateSymmetric(sessions[0].Context().get(), alloc, &out);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  v1::SymmetricAllocation out;
  status = sessions[0].groups->AllocateSymmetric(sessions[0].Context().get(), alloc, &out);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("limits.max_allocations_per_session"));

  // Another session cannot use a group it is not in: NOT_FOUND, not PERMISSION_DENIED.
  status = sessions[1].groups->AllocateSymmetric(sessions[1].Context().get(), alloc, &out);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);

  v1::ListGroupsResponse groups;
  ASSERT_TRUE(sessions[0].groups->ListGroups(sessions[0].Context().get(), {}, &groups).ok());
  EXPECT_EQ(groups.groups_size(), 2);  // both groups are job "job"'s
  auto stranger = Open("another-job");
  EXPECT_FALSE(stranger.ok());  // the session limit still holds
}

}  // namespace
}  // namespace commd::testing
