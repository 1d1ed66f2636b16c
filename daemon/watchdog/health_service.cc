#include "daemon/watchdog/health_service.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::watchdog {

namespace {

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
  return rpc_->ServeLater(
      ctx, "GetHealth", [&](auto session, std::shared_ptr<server::PendingCall> call) {
        absl::StatusOr<groups::GroupSelector> filter =
            groups::SelectorFor(*session, request->job_id(), request->all_jobs(), request->group());
        if (!filter.ok()) return call->Finish(filter.status());
        std::vector<v1::GroupHealth> local = watchdog_->Health(*filter);
        if (!request->cluster()) {
          if (!request->group().empty() && local.empty()) {
            return call->Finish(
                absl::NotFoundError(absl::StrCat("no group ", QuoteForError(request->group()))));
          }
          return call->FinishOk([&] {
            for (auto& h : local) *response->add_groups() = std::move(h);
          });
        }
        if (cluster_ == nullptr) {
          return call->Finish(absl::FailedPreconditionError(
              "this daemon is not in a cluster (no cluster.etcd_endpoints): there is no other "
              "node's view to show"));
        }
        if (request->all_jobs() || (!filter->job && !filter->job_any_uid)) {
          return call->Finish(absl::InvalidArgumentError(
              "the cluster's view is of one job: name it (--job J), not all jobs"));
        }
        const uint32_t caller = session->uid;
        {
          absl::MutexLock lock(&mu_);
          if (!reading_.insert(caller).second) {
            return call->Finish(absl::ResourceExhaustedError(
                absl::StrCat("uid ", caller,
                             " has a read of the cluster's views in flight already; one at a "
                             "time per uid")));
          }
        }
        std::optional<uint32_t> uid;
        std::string job;
        if (filter->job) {
          uid = filter->job->first;
          job = filter->job->second;
        } else {
          job = *filter->job_any_uid;
        }
        cluster_->Read(uid, job, request->group(),
                       [this, call, response, caller, local = std::move(local)](
                           absl::StatusOr<std::vector<v1::NodeGroupView>> views) mutable {
                         {
                           absl::MutexLock lock(&mu_);
                           reading_.erase(caller);
                         }
                         if (!views.ok()) return call->Finish(views.status());
                         call->FinishOk([&] {
                           for (auto& h : local) *response->add_groups() = std::move(h);
                           for (auto& v : *views) *response->add_cluster() = std::move(v);
                         });
                       });
      });
}

grpc::ServerUnaryReactor* HealthService::Abort(grpc::CallbackServerContext* ctx,
                                               const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  return rpc_->Serve(ctx, "Abort", [&](const server::Session& session) -> absl::Status {
    if (request->group().empty()) {
      return absl::InvalidArgumentError("abort needs a group name (--group)");
    }
    if (request->reason().empty() || request->reason().size() > kMaxAbortReasonBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("abort reason of ", request->reason().size(), " bytes; allowed 1 to ",
                       kMaxAbortReasonBytes, " (the control block's abort text of ",
                       kAbortTextBytes - 1, " bytes also names who asked)"));
    }
    ASSIGN_OR_RETURN(groups::GroupSelector filter,
                     groups::SelectorFor(session, request->job_id(), false, request->group()));
    ASSIGN_OR_RETURN(int notified, watchdog_->Abort(filter, AbortText(session, request->reason())));
    response->set_ranks_notified(notified);
    return absl::OkStatus();
  });
}

}  // namespace commd::watchdog
