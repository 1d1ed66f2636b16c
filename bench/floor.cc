#include "bench/floor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "grpcpp/grpcpp.h"

namespace commd::bench {
namespace {

class FloorService final : public commd_bench::Floor::CallbackService {
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const commd_bench::Empty*,
                                 commd_bench::Empty*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

}  // namespace

FloorServer::FloorServer(const std::string& socket) {
  pid_ = ::fork();
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    FloorService service;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    builder.BuildAndStart()->Wait();
    ::_exit(0);
  }
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  stub_ = commd_bench::Floor::NewStub(channel);
}

FloorServer::~FloorServer() {
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

void FloorServer::Ping() {
  grpc::ClientContext ctx;
  commd_bench::Empty in, out;
  stub_->Ping(&ctx, in, &out);
}

}  // namespace commd::bench
