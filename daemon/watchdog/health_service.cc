#include "daemon/watchdog/health_service.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::watchdog {

namespace {

// The control block's abort text (255 bytes) carries who asked as well: at most 64 bytes
// (AbortText), the reason gets the rest.
constexpr size_t kMaxReasonBytes = kAbortTextBytes - 1 - 64;

// "uid 1000 (commctl, pid 4242) says: <reason>": the ranks' errors name who stopped them.
// The program name is the caller's /proc/<pid>/comm, for the reader only (a process names
// itself); its non-printable bytes become '?'.
std::string AbortText(const server::Session& session, const std::string& reason) {
  std::string comm;
  std::getline(std::ifstream(absl::StrCat("/proc/", session.pid, "/comm")), comm);
  for (char& c : comm) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return absl::StrCat("uid ", session.uid, " (", comm.empty() ? "" : comm + ", ", "pid ",
                      session.pid, ") says: ", reason);
}

}  // namespace

grpc::ServerUnaryReactor* HealthService::GetHealth(grpc::CallbackServerContext* ctx,
                                                   const v1::GetHealthRequest* request,
                                                   v1::GetHealthResponse* response) {
  return rpc_->Serve(ctx, "GetHealth", [&](const server::Session& session) -> absl::Status {
    ASSIGN_OR_RETURN(
        groups::GroupSelector filter,
        groups::SelectorFor(session, request->job_id(), request->all_jobs(), request->group()));
    for (auto& h : watchdog_->Health(filter)) *response->add_groups() = std::move(h);
    if (!request->group().empty() && response->groups_size() == 0) {
      return absl::NotFoundError(absl::StrCat("no group ", QuoteForError(request->group())));
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* HealthService::Abort(grpc::CallbackServerContext* ctx,
                                               const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  return rpc_->Serve(ctx, "Abort", [&](const server::Session& session) -> absl::Status {
    if (request->group().empty()) {
      return absl::InvalidArgumentError("abort needs a group name (--group)");
    }
    if (request->reason().empty() || request->reason().size() > kMaxReasonBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("abort reason of ", request->reason().size(), " bytes; allowed 1 to ",
                       kMaxReasonBytes, " (the control block's abort text of ", kAbortTextBytes - 1,
                       " bytes also names who asked)"));
    }
    ASSIGN_OR_RETURN(groups::GroupSelector filter,
                     groups::SelectorFor(session, request->job_id(), false, request->group()));
    ASSIGN_OR_RETURN(int notified, watchdog_->Abort(filter, AbortText(session, request->reason())));
    response->set_ranks_notified(notified);
    return absl::OkStatus();
  });
}

}  // namespace commd::watchdog
