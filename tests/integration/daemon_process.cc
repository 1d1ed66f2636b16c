#include "tests/integration/daemon_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/config/config.h"

namespace commd::testing {

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  ASSIGN_OR_RETURN(config::HostPort hp, config::ParseHostPort(address));
  SYS_ASSIGN_OR_RETURN(int raw, ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  UniqueFd fd(raw);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(hp.port));
  if (::inet_pton(AF_INET, hp.host.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", hp.host));
  }
  SYS_RETURN_IF_ERROR(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)));
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\nConnection: close\r\n\r\n");
  SYS_RETURN_IF_ERROR(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL));
  std::string response;
  char buf[65536];
  for (;;) {
    SYS_ASSIGN_OR_RETURN(ssize_t n, ::recv(fd.get(), buf, sizeof(buf), 0));
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("not an HTTP response: ", response.substr(0, 200)));
  }
  if (response.find(" 200 ") == std::string::npos || response.find(" 200 ") > body) {
    return absl::InternalError(
        absl::StrCat("HTTP error: ", response.substr(0, response.find('\r'))));
  }
  return response.substr(body + 4);
}

namespace {

const std::regex& LabelRegex() {
  static const std::regex kLabel(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)")re");
  return kLabel;
}

// `a="x"` strings of a label list such as `a="x",b="y"`.
std::set<std::string> LabelsOf(const std::string& text) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), LabelRegex());
       it != std::sregex_iterator(); ++it) {
    out.insert(it->str());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(const std::string& text) {
  // name{labels} value [timestamp]; labels re-sorted so lookups need not know the order.
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$)");
  const std::regex& kLabel = LabelRegex();
  std::map<std::string, double> out;
  for (absl::string_view raw : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string line(raw);
    if (line[0] == '#') {
      if (line.rfind("# HELP ", 0) != 0 && line.rfind("# TYPE ", 0) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("bad comment line: ", line));
      }
      continue;
    }
    std::smatch m;
    if (!std::regex_match(line, m, kSample)) {
      return absl::InvalidArgumentError(absl::StrCat("bad sample line: ", line));
    }
    std::vector<std::string> labels;
    const std::string label_text = m[3];
    for (auto it = std::sregex_iterator(label_text.begin(), label_text.end(), kLabel);
         it != std::sregex_iterator(); ++it) {
      labels.push_back(absl::StrCat((*it)[1].str(), "=\"", (*it)[2].str(), "\""));
    }
    std::sort(labels.begin(), labels.end());
    double value = 0;
    const std::string v = m[4];
    if (v == "+Inf") {
      value = HUGE_VAL;
    } else if (v == "-Inf") {
      value = -HUGE_VAL;
    } else if (v == "NaN") {
      value = NAN;
    } else if (!absl::SimpleAtod(v, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value in: ", line));
    }
    const std::string key = labels.empty()
                                ? m[1].str()
                                : absl::StrCat(m[1].str(), "{", absl::StrJoin(labels, ","), "}");
    out[key] = value;
  }
  return out;
}

double MetricValue(const DaemonProcess& daemon, const std::string& key) {
  auto metrics = Scrape(daemon);
  if (!metrics.ok()) return -1;
  const size_t brace = key.find('{');
  const std::string name = key.substr(0, brace);
  const std::set<std::string> want =
      brace == std::string::npos ? std::set<std::string>{} : LabelsOf(key.substr(brace));
  double sum = 0;
  for (auto it = metrics->lower_bound(name); it != metrics->end(); ++it) {
    const std::string& series = it->first;
    if (series.compare(0, name.size(), name) != 0) break;
    if (series.size() > name.size() && series[name.size()] != '{') continue;  // a longer name
    const std::set<std::string> have = LabelsOf(series.substr(name.size()));
    if (std::includes(have.begin(), have.end(), want.begin(), want.end())) sum += it->second;
  }
  return sum;
}

absl::StatusOr<std::map<std::string, double>> Scrape(const DaemonProcess& daemon) {
  ASSIGN_OR_RETURN(std::string body, HttpGet(daemon.metrics_address(), "/metrics"));
  return ParsePrometheusText(body);
}

}  // namespace commd::testing
