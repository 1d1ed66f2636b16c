#include "daemon/config/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "commd/v1/options.pb.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace commd::config {

extern const char kEmbeddedDefaultConfig[];  // generated from deploy/commd.textproto

namespace {

namespace pb = google::protobuf;

// Collects parser errors as "source:line:column: message (in: <line text>)" so a type error
// names the field even when the parser's message does not.
class ErrorCollector : public pb::io::ErrorCollector {
 public:
  ErrorCollector(absl::string_view source, absl::string_view text)
      : source_(source), lines_(absl::StrSplit(text, '\n')) {}

  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    // The parser reports some errors at the token after the offending value, which may be
    // on a later (blank) line; name the last line that has text instead.
    line = std::min<int>(line, static_cast<int>(lines_.size()) - 1);
    while (line > 0 && absl::StripAsciiWhitespace(lines_[line]).empty()) --line;
    std::string context;
    if (line >= 0) {
      context = absl::StrCat(" (in: ", absl::StripAsciiWhitespace(lines_[line]), ")");
    }
    errors_.push_back(absl::StrCat(source_, ":", line + 1, ": ", message, context));
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}

  std::string Joined() const { return absl::StrJoin(errors_, "; "); }

 private:
  std::string source_;
  std::vector<absl::string_view> lines_;
  std::vector<std::string> errors_;
};

std::string FieldPath(const std::string& prefix, const pb::FieldDescriptor* field) {
  return prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
}

std::string Where(absl::string_view source, const pb::TextFormat::ParseInfoTree* tree,
                  const pb::FieldDescriptor* field, int index = -1) {
  const auto loc =
      tree == nullptr ? pb::TextFormat::ParseLocation() : tree->GetLocation(field, index);
  if (loc.line < 0) return std::string(source);
  return absl::StrCat(source, ":", loc.line + 1);
}

std::string EnumChoices(const pb::EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 1; i < e->value_count(); ++i) names.push_back(e->value(i)->name());
  return absl::StrJoin(names, ", ");
}

absl::Status CheckScalar(const pb::Message& msg, const pb::FieldDescriptor* field,
                         const std::string& path, const std::string& where) {
  const pb::Reflection* r = msg.GetReflection();
  if (field->options().HasExtension(v1::range)) {
    const v1::Range& range = field->options().GetExtension(v1::range);
    int64_t value = 0;
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        value = r->GetInt32(msg, field);
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        value = r->GetInt64(msg, field);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        value = r->GetUInt32(msg, field);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        value = static_cast<int64_t>(std::min<uint64_t>(r->GetUInt64(msg, field), INT64_MAX));
        break;
      default:
        break;
    }
    if (value < range.min() || value > range.max()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", path, " = ", value,
                                                     " is out of range; allowed ", range.min(),
                                                     " to ", range.max()));
    }
  }
  if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM && r->GetEnumValue(msg, field) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", path, " must be one of ", EnumChoices(field->enum_type())));
  }
  if (path == "recorder.ring_capacity") {
    const uint32_t v = r->GetUInt32(msg, field);
    if ((v & (v - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", path, " = ", v, " is not a power of two"));
    }
  }
  if (path == "cluster.prefix") {
    const std::string v = r->GetString(msg, field);
    if (v.size() < 2 || v.front() != '/' || v.back() == '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", path, " = '", v, "' must start with '/' and not end with one (\"/commd\")"));
    }
  }
  if (path == "cluster.node_name" && !r->GetString(msg, field).empty()) {
    if (absl::Status s = ValidateJobId(r->GetString(msg, field)); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", path, " = '", r->GetString(msg, field), "' must be ", JobIdRule()));
    }
  }
  if (path == "metrics_address") {
    auto hp = ParseHostPort(r->GetString(msg, field));
    if (!hp.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", path, ": ", hp.status().message()));
  }
  return absl::OkStatus();
}

// Validates every field set in `msg` (recursively), naming its line from `tree`.
absl::Status Validate(const pb::Message& msg, absl::string_view source,
                      const pb::TextFormat::ParseInfoTree* tree, const std::string& prefix) {
  const pb::Descriptor* d = msg.GetDescriptor();
  const pb::Reflection* r = msg.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* field = d->field(i);
    const std::string path = FieldPath(prefix, field);
    if (path == "cluster.etcd_endpoints") {
      for (int j = 0; j < r->FieldSize(msg, field); ++j) {
        auto hp = ParseHostPort(r->GetRepeatedString(msg, field, j));
        if (!hp.ok() || hp->port == 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              Where(source, tree, field, j), ": ", path, ": '", r->GetRepeatedString(msg, field, j),
              "' is not HOST:PORT with a port from 1 to 65535"));
        }
      }
    }
    if (field->is_repeated() || !r->HasField(msg, field)) continue;
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      const auto* nested = tree == nullptr ? nullptr : tree->GetTreeForNested(field, -1);
      RETURN_IF_ERROR(Validate(r->GetMessage(msg, field), source, nested, path));
    } else {
      RETURN_IF_ERROR(CheckScalar(msg, field, path, Where(source, tree, field)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view DefaultConfigText() { return kEmbeddedDefaultConfig; }

v1::DaemonConfig DefaultConfig() {
  v1::DaemonConfig config;
  // The embedded text is checked by config_test; a failure here is a build defect.
  pb::TextFormat::ParseFromString(std::string(DefaultConfigText()), &config);
  return config;
}

absl::StatusOr<v1::DaemonConfig> ParseConfig(absl::string_view text, absl::string_view source) {
  v1::DaemonConfig user;
  ErrorCollector errors(source, text);
  pb::TextFormat::ParseInfoTree tree;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(std::string(text), &user)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid config: ", errors.Joined()));
  }
  RETURN_IF_ERROR(Validate(user, source, &tree, ""));
  v1::DaemonConfig merged = DefaultConfig();
  merged.MergeFrom(user);
  return merged;
}

absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot read config file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseConfig(buffer.str(), path);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not HOST:PORT (e.g. 127.0.0.1:9464)"));
  }
  HostPort out;
  out.host = std::string(address.substr(0, colon));
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  const absl::string_view port = address.substr(colon + 1);
  if (!absl::SimpleAtoi(port, &out.port) || out.port < 0 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port '", port, "' in '", address, "' is not a number from 0 to 65535"));
  }
  return out;
}

}  // namespace commd::config
