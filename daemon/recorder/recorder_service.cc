#include "daemon/recorder/recorder_service.h"

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::recorder {

grpc::ServerUnaryReactor* RecorderService::Dump(grpc::CallbackServerContext* ctx,
                                                const v1::DumpRequest* request,
                                                v1::DumpResponse* response) {
  return rpc_->Serve(ctx, "Dump", [&](const server::Session& session) -> absl::Status {
    groups::DumpFilter filter;
    filter.group = request->group();
    const bool other_job = !request->job_id().empty() && request->job_id() != session.job_id;
    if ((other_job || request->all_jobs()) && !session.admin) {
      // Another job's groups are invisible, not forbidden.
      return absl::NotFoundError(
          absl::StrCat("no job ", request->all_jobs() ? "(all)" : QuoteForError(request->job_id()),
                       " visible to this session"));
    }
    if (!request->all_jobs()) {
      // An admin naming a job means that job under any uid; otherwise the caller's own.
      filter.job = {session.uid, other_job ? request->job_id() : session.job_id};
    }
    std::vector<DumpSource> sources = groups_->DumpSources(filter);
    if (other_job) {
      groups::DumpFilter any_uid{.job = std::nullopt, .group = request->group()};
      sources.clear();
      for (auto& s : groups_->DumpSources(any_uid)) {
        if (s.job_id == request->job_id()) sources.push_back(std::move(s));
      }
    }
    if (sources.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "no formed group", request->group().empty() ? "" : " " + QuoteForError(request->group()),
          " to dump"));
    }
    // A user's requests count against its dump rate; an admin's do not.
    if (!session.admin) RETURN_IF_ERROR(dumper_->Admit(session.uid, "request"));
    ASSIGN_OR_RETURN(DumpResult result, dumper_->Dump("request", sources, std::nullopt));
    for (const auto& d : result.directories) response->add_directories(d);
    for (const auto& f : result.files) response->add_files(f);
    response->set_entries(result.entries);
    response->set_invalid_entries(result.invalid_entries);
    return absl::OkStatus();
  });
}

}  // namespace commd::recorder
