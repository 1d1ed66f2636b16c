// One-line-per-event logging: time, level, component, message.
//
//   COMMD_LOG(INFO, "server") << "listening on " << path;
//
// Lines go to stderr with a single write(2), so lines of different threads never interleave.
// Under systemd (JOURNAL_STREAM set) each line starts with the syslog priority prefix "<N>"
// that journald turns into the entry's priority, and the timestamp is left to the journal.
#ifndef COMMD_COMMON_LOG_H_
#define COMMD_COMMON_LOG_H_

#include <sstream>

#include "absl/strings/string_view.h"

namespace commd {

enum class LogSeverity { kDebug = 1, kInfo = 2, kWarning = 3, kError = 4 };

// Least severe level written; thread-safe, may change at run time (SIGHUP reload).
void SetMinLogLevel(LogSeverity level);
LogSeverity MinLogLevel();
bool LogEnabled(LogSeverity level);
// Parses "debug", "info", "warning"/"warn", "error" (any case).
bool ParseLogSeverity(absl::string_view text, LogSeverity* out);
absl::string_view LogSeverityName(LogSeverity level);

class LogMessage {
 public:
  LogMessage(LogSeverity level, absl::string_view component);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity level_;
  std::ostringstream stream_;
};

// Swallows the stream expression when the level is off, so arguments are not evaluated.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace commd

#define COMMD_LOG_LEVEL_DEBUG ::commd::LogSeverity::kDebug
#define COMMD_LOG_LEVEL_INFO ::commd::LogSeverity::kInfo
#define COMMD_LOG_LEVEL_WARNING ::commd::LogSeverity::kWarning
#define COMMD_LOG_LEVEL_ERROR ::commd::LogSeverity::kError

#define COMMD_LOG(level, component)             \
  !::commd::LogEnabled(COMMD_LOG_LEVEL_##level) \
      ? (void)0                                 \
      : ::commd::LogVoidify() & ::commd::LogMessage(COMMD_LOG_LEVEL_##level, component).stream()

// For the few lifecycle lines (ready, reloaded, stopping, stopped) that operators and
// supervisors rely on whatever the configured level.
#define COMMD_LOG_ALWAYS(component) \
  ::commd::LogMessage(::commd::LogSeverity::kInfo, component).stream()

#endif  // COMMD_COMMON_LOG_H_
