#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace commd {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogSeverity::kInfo)};

bool UnderJournal() {
  static const bool journal = std::getenv("JOURNAL_STREAM") != nullptr;
  return journal;
}

int SyslogPriority(LogSeverity level) {
  switch (level) {
    case LogSeverity::kDebug:
      return 7;
    case LogSeverity::kInfo:
      return 6;
    case LogSeverity::kWarning:
      return 4;
    case LogSeverity::kError:
      return 3;
  }
  return 6;
}

}  // namespace

void SetMinLogLevel(LogSeverity level) { g_min_level.store(static_cast<int>(level)); }
LogSeverity MinLogLevel() { return static_cast<LogSeverity>(g_min_level.load()); }
bool LogEnabled(LogSeverity level) {
  return static_cast<int>(level) >= g_min_level.load(std::memory_order_relaxed);
}

bool ParseLogSeverity(absl::string_view text, LogSeverity* out) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") {
    *out = LogSeverity::kDebug;
  } else if (lower == "info") {
    *out = LogSeverity::kInfo;
  } else if (lower == "warning" || lower == "warn") {
    *out = LogSeverity::kWarning;
  } else if (lower == "error") {
    *out = LogSeverity::kError;
  } else {
    return false;
  }
  return true;
}

absl::string_view LogSeverityName(LogSeverity level) {
  switch (level) {
    case LogSeverity::kDebug:
      return "DEBUG";
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARN";
    case LogSeverity::kError:
      return "ERROR";
  }
  return "INFO";
}

LogMessage::LogMessage(LogSeverity level, absl::string_view component) : level_(level) {
  if (UnderJournal()) {
    stream_ << '<' << SyslogPriority(level) << '>';
  } else {
    stream_ << absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(), absl::UTCTimeZone());
  }
  stream_ << LogSeverityName(level) << ' ' << component << ": ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  // One write per line; a short write to a pipe of this size does not happen in practice,
  // and a logger has nowhere to report its own failure.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace commd
