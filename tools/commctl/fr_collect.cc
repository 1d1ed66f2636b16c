#include "tools/commctl/fr_collect.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/names.h"
#include "format/job_diagnosis.h"
#include "nlohmann/json.hpp"

namespace commd::ctl {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The directories of dump `id` under `source`: the source itself, <source>/<id>, or
// <source>/<job>/<id>.
std::vector<fs::path> DumpDirectoriesIn(const fs::path& source, const std::string& id) {
  std::vector<fs::path> found;
  std::error_code ec;
  if (source.filename() == id && fs::is_directory(source, ec)) found.push_back(source);
  if (fs::is_directory(source / id, ec)) found.push_back(source / id);
  for (auto it = fs::directory_iterator(source, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (it->is_directory(ec) && fs::is_directory(it->path() / id, ec)) {
      found.push_back(it->path() / id);
    }
  }
  return found;
}

// rank<N>.json -> N; -1 for any other name.
int RankOfFile(const std::string& name) {
  int rank = -1;
  if (name.size() <= 9 || name.rfind("rank", 0) != 0 || name.substr(name.size() - 5) != ".json" ||
      !absl::SimpleAtoi(name.substr(4, name.size() - 9), &rank)) {
    return -1;
  }
  return rank;
}

// The global ranks a rank's dump says its group has (pg_config's "[0, 1, ...]").
void AddExpectedRanks(const std::string& text, std::set<int>* expected) {
  const nlohmann::json dump = nlohmann::json::parse(text, nullptr, false);
  if (!dump.is_object() || !dump.contains("pg_config") || !dump["pg_config"].is_object()) return;
  for (const auto& [name, pg] : dump["pg_config"].items()) {
    if (!pg.is_object() || !pg.contains("ranks") || !pg["ranks"].is_string()) continue;
    const nlohmann::json ranks =
        nlohmann::json::parse(pg["ranks"].get<std::string>(), nullptr, false);
    if (!ranks.is_array()) continue;
    for (const auto& r : ranks) {
      if (r.is_number_integer()) expected->insert(r.get<int>());
    }
  }
}

// Copies one file into `to`, unless the same file is there already.
absl::Status CopyOne(const fs::path& from, const fs::path& to, bool* copied) {
  *copied = false;
  std::error_code ec;
  if (fs::exists(to, ec)) {
    auto a = ReadFile(from);
    auto b = ReadFile(to);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    if (*a == *b) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        from.string(), " and the file collected before it as ", to.string(),
        " differ: two nodes wrote the same rank's dump (do two nodes claim one global rank?)"));
  }
  fs::copy_file(from, to, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot copy ", from.string(), ": ", ec.message()));
  *copied = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CollectResult> CollectDump(const std::vector<std::string>& sources,
                                          const std::string& dump_id, const std::string& out_dir) {
  if (absl::Status s = ValidateJobId(dump_id); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dump id ", QuoteForError(dump_id),
                     " is not one commd makes (letters, digits and . _ - : only)"));
  }
  if (sources.empty()) return absl::InvalidArgumentError("fr collect needs a source directory");
  CollectResult result;
  for (const std::string& source : sources) {
    for (const fs::path& dir : DumpDirectoriesIn(source, dump_id)) {
      result.directories.push_back(dir.string());
      std::error_code ec;
      for (auto g = fs::directory_iterator(dir, ec); !ec && g != fs::directory_iterator();
           g.increment(ec)) {
        if (!g->is_directory()) continue;
        const std::string group = g->path().filename().string();
        CollectedGroup& collected = result.groups[group];
        fs::create_directories(fs::path(out_dir) / group, ec);
        if (ec) {
          return absl::PermissionDeniedError(
              absl::StrCat("cannot create ", out_dir, "/", group, ": ", ec.message()));
        }
        std::error_code fec;
        for (auto f = fs::directory_iterator(g->path(), fec); !fec && f != fs::directory_iterator();
             f.increment(fec)) {
          const std::string name = f->path().filename().string();
          // Skip what a dump leaves while writing (files are written as .tmp and renamed).
          if (!f->is_regular_file() || name.front() == '.') continue;
          bool copied = false;
          if (absl::Status s = CopyOne(f->path(), fs::path(out_dir) / group / name, &copied);
              !s.ok()) {
            return s;
          }
          result.files += copied ? 1 : 0;
          if (const int rank = RankOfFile(name); rank >= 0) {
            collected.ranks.insert(rank);
            if (auto text = ReadFile(f->path()); text.ok()) {
              AddExpectedRanks(*text, &collected.expected);
            }
          }
        }
      }
    }
  }
  if (result.directories.empty()) {
    return absl::NotFoundError(absl::StrCat("no directory of dump ", dump_id, " under ",
                                            absl::StrJoin(sources, ", "), " (looked for DIR, DIR/",
                                            dump_id, " and DIR/*/", dump_id, ")"));
  }
  return result;
}

std::string FormatCollect(const CollectResult& result, const std::string& dump_id,
                          const std::string& out_dir) {
  std::string out = absl::StrCat("collected dump ", dump_id, " from ", result.directories.size(),
                                 " director", result.directories.size() == 1 ? "y" : "ies",
                                 " into ", out_dir, " (", result.files, " file(s) copied):\n");
  for (const auto& [group, g] : result.groups) {
    std::set<int> expected = g.expected;
    expected.insert(g.ranks.begin(), g.ranks.end());
    std::set<int> missing;
    for (int r : expected) {
      if (g.ranks.count(r) == 0) missing.insert(r);
    }
    absl::StrAppend(
        &out, "  group ", group, ": global ranks ", diagnosis::RankRanges(g.ranks), " (",
        g.ranks.size(), " of ", expected.size(), ")",
        missing.empty() ? "" : absl::StrCat("; no dump of ", diagnosis::RankRanges(missing)), "\n");
  }
  return out;
}

}  // namespace commd::ctl
