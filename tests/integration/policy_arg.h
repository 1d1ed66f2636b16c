// The test rank programs' POLICY argument: default | report | notify | terminate.
#ifndef COMMD_TESTS_INTEGRATION_POLICY_ARG_H_
#define COMMD_TESTS_INTEGRATION_POLICY_ARG_H_

#include <string>

#include "commd/commd.h"

namespace commd::testing {

// Anything else is kDefault (the daemon's watchdog.policy).
inline GroupOptions::WatchdogPolicy ParsePolicy(const std::string& s) {
  using P = GroupOptions::WatchdogPolicy;
  if (s == "report") return P::kReport;
  if (s == "notify") return P::kNotify;
  if (s == "terminate") return P::kTerminate;
  return P::kDefault;
}

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_POLICY_ARG_H_
