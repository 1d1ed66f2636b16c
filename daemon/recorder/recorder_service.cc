#include "daemon/recorder/recorder_service.h"

#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace commd::recorder {
namespace {

// The answer of one Dump call, which has two parts that finish in either order: this node's
// files, and the announcement to the job's other nodes.
struct DumpAnswer {
  absl::Mutex mu;
  int parts_left ABSL_GUARDED_BY(mu) = 2;
  DumpResult result ABSL_GUARDED_BY(mu);
  std::string announce_error ABSL_GUARDED_BY(mu);
};

void FillResponse(const DumpResult& result, const std::string& announce_error,
                  v1::DumpResponse* response) {
  for (const auto& d : result.directories) response->add_directories(d);
  for (const auto& f : result.files) response->add_files(f);
  response->set_entries(result.entries);
  response->set_invalid_entries(result.invalid_entries);
  response->set_dump_id(result.dump_id);
  response->set_announced(result.announced && announce_error.empty());
  response->set_announce_error(announce_error);
}

}  // namespace

grpc::ServerUnaryReactor* RecorderService::Dump(grpc::CallbackServerContext* ctx,
                                                const v1::DumpRequest* request,
                                                v1::DumpResponse* response) {
  return rpc_->ServeLater(
      ctx, "Dump", [&](auto session, std::shared_ptr<server::PendingCall> call) {
        absl::StatusOr<groups::GroupSelector> selector =
            groups::SelectorFor(*session, request->job_id(), request->all_jobs(), request->group());
        if (!selector.ok()) return call->Finish(selector.status());
        auto answer = std::make_shared<DumpAnswer>();
        // Whichever part ends last answers.
        auto part_done = [answer, call, response] {
          absl::MutexLock lock(&answer->mu);
          if (--answer->parts_left > 0) return;
          call->FinishOk([&] { FillResponse(answer->result, answer->announce_error, response); });
        };
        // A user's requests count against its dump rate; an admin's do not.
        DumpHow how{.now = true,
                    .charge = session->admin ? std::nullopt : std::optional(session->uid),
                    .local_only = request->local_only(),
                    .announce_group_only = true};
        how.announced = [answer, part_done](absl::Status s) {
          {
            absl::MutexLock lock(&answer->mu);
            if (!s.ok()) answer->announce_error = std::string(s.message());
          }
          part_done();
        };
        // A failed dump announced nothing (GroupDumps announces only after the local files).
        absl::StatusOr<DumpResult> result =
            dumps_->DumpGroups(*selector, "request", std::nullopt, std::move(how));
        if (!result.ok()) return call->Finish(result.status());
        {
          absl::MutexLock lock(&answer->mu);
          answer->result = std::move(*result);
          if (!answer->result.announced) --answer->parts_left;  // no outcome is coming
        }
        part_done();
      });
}

}  // namespace commd::recorder
