// Test support: the real commd binary started on a temporary runtime dir (the launcher in
// common/testing/child_process.h, shared with commd-bench), and the small tools tests use to
// look at it from outside (an HTTP scrape of its metrics).
#ifndef COMMD_TESTS_INTEGRATION_DAEMON_PROCESS_H_
#define COMMD_TESTS_INTEGRATION_DAEMON_PROCESS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/testing/child_process.h"

namespace commd::testing {

// GET http://<address><path>; returns the body of a 200 answer.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

// Prometheus text exposition, parsed: "name{a=\"x\",b=\"y\"}" (labels sorted) -> value.
// Fails on a line that is not valid exposition format.
absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(const std::string& text);

// Scrape + parse.
absl::StatusOr<std::map<std::string, double>> Scrape(const DaemonProcess& daemon);

// The sum of the samples of metric `x` that carry every label `key` names, as PromQL's
// sum(x{a="1"}) would give: `x{a="1",b="2"}` is one series, `x{a="1"}` adds up every `b`, `x`
// every series. 0 when none matches, -1 when the scrape failed.
double MetricValue(const DaemonProcess& daemon, const std::string& key);

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_DAEMON_PROCESS_H_
