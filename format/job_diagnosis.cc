#include "format/job_diagnosis.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace commd::diagnosis {

namespace {

// "global rank 3" / "global ranks 0-2, 5".
std::string GlobalRanks(const std::set<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "global rank " : "global ranks ",
                      RankRanges(ranks, kMaxRunsNamed));
}

}  // namespace

std::string RankRanges(const std::set<int>& ranks, size_t max_runs) {
  std::vector<std::string> parts;
  size_t named = 0;
  for (auto it = ranks.begin(); it != ranks.end() && parts.size() < max_runs;) {
    const int first = *it;
    int last = first;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    parts.push_back(first == last ? absl::StrCat(first) : absl::StrCat(first, "-", last));
    named += static_cast<size_t>(last - first) + 1;
  }
  if (named < ranks.size()) parts.push_back(absl::StrCat("and ", ranks.size() - named, " more"));
  return absl::StrJoin(parts, ", ");
}

std::optional<std::string> GroupHoldup(absl::Span<const v1::NodeGroupView* const> views) {
  if (views.empty()) return std::nullopt;
  uint64_t entered = 0;
  size_t ranks = 0;
  for (const v1::NodeGroupView* v : views) {
    for (const v1::RankView& r : v->ranks()) entered = std::max(entered, r.last_enqueued_seq());
    ranks += static_cast<size_t>(v->ranks_size());
  }
  if (entered == 0) return std::nullopt;
  // By node name, so that the sentence does not depend on the order of the views.
  std::map<std::string, std::set<int>> not_entered, not_done;
  std::set<int> in_it, finished;
  for (const v1::NodeGroupView* v : views) {
    for (const v1::RankView& r : v->ranks()) {
      if (r.last_enqueued_seq() < entered) {
        not_entered[v->node()].insert(r.global_rank());
      } else {
        in_it.insert(r.global_rank());
      }
      if (r.last_completed_seq() < entered) {
        not_done[v->node()].insert(r.global_rank());
      } else {
        finished.insert(r.global_rank());
      }
    }
  }
  const bool never = !not_entered.empty();
  const auto& who = never ? not_entered : not_done;
  if (who.empty()) return std::nullopt;
  std::vector<std::string> parts;
  size_t behind = 0, unnamed_nodes = 0, unnamed_ranks = 0;
  for (const auto& [node, global] : who) {
    behind += global.size();
    if (parts.size() < kMaxNodesNamed) {
      parts.push_back(absl::StrCat(GlobalRanks(global), " on ", node));
    } else {
      ++unnamed_nodes;
      unnamed_ranks += global.size();
    }
  }
  if (unnamed_nodes > 0) {
    parts.push_back(
        absl::StrCat(unnamed_nodes, " more node(s) (", unnamed_ranks, " global rank(s))"));
  }
  const std::set<int>& others = never ? in_it : finished;
  std::string sentence =
      absl::StrCat("group ", views.front()->health().group(), ": ", absl::StrJoin(parts, " and "),
                   never ? " never entered" : " did not finish", " collective ", entered);
  if (!others.empty()) {
    absl::StrAppend(&sentence, " that ", GlobalRanks(others),
                    never ? (others.size() == 1 ? " waits in" : " wait in") : " finished");
  }
  absl::StrAppend(&sentence, " (", never ? ranks - behind : behind, " of ", ranks, " ranks ",
                  never ? "entered it" : "still in it", ")");
  return sentence;
}

std::vector<std::string> JobDiagnosis(
    const google::protobuf::RepeatedPtrField<v1::NodeGroupView>& views) {
  std::map<std::string, std::vector<const v1::NodeGroupView*>> by_group;
  for (const v1::NodeGroupView& v : views) by_group[v.health().group()].push_back(&v);
  std::vector<std::string> lines;
  for (const auto& [group, of_group] : by_group) {
    if (std::optional<std::string> s = GroupHoldup(of_group)) lines.push_back(std::move(*s));
  }
  return lines;
}

}  // namespace commd::diagnosis
