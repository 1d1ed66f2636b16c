#include "daemon/recorder/recorder_service.h"

#include "common/status_macros.h"

namespace commd::recorder {

grpc::ServerUnaryReactor* RecorderService::Dump(grpc::CallbackServerContext* ctx,
                                                const v1::DumpRequest* request,
                                                v1::DumpResponse* response) {
  return rpc_->Serve(ctx, "Dump", [&](const server::Session& session) -> absl::Status {
    ASSIGN_OR_RETURN(
        groups::GroupSelector selector,
        groups::SelectorFor(session, request->job_id(), request->all_jobs(), request->group()));
    // A user's requests count against its dump rate; an admin's do not.
    const DumpHow how{.now = true,
                      .charge = session.admin ? std::nullopt : std::optional(session.uid)};
    ASSIGN_OR_RETURN(DumpResult result, dumps_->DumpGroups(selector, "request", std::nullopt, how));
    for (const auto& d : result.directories) response->add_directories(d);
    for (const auto& f : result.files) response->add_files(f);
    response->set_entries(result.entries);
    response->set_invalid_entries(result.invalid_entries);
    return absl::OkStatus();
  });
}

}  // namespace commd::recorder
