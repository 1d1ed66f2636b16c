// commctl: the operator's CLI for the node's commd. Logic lives in commands.cc.
#include <cstdio>
#include <iostream>

#include "tools/commctl/commands.h"

int main(int argc, char** argv) {
  commd::ctl::GlobalOptions options;
  std::vector<std::string> args;
  absl::Status parsed = commd::ctl::ParseArgs(argc, argv, &options, &args);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") return std::fputs(commd::ctl::Usage(), stdout) < 0;
  }
  if (parsed.ok() && args.empty()) parsed = absl::InvalidArgumentError("no command given");
  if (!parsed.ok()) {
    std::fprintf(stderr, "commctl: %s\nTry 'commctl --help'.\n",
                 std::string(parsed.message()).c_str());
    return 2;
  }
  const absl::Status s = commd::ctl::RunCommand(options, args, std::cout);
  if (!s.ok()) {
    std::fprintf(stderr, "commctl: %s\n", s.ToString().c_str());
    return absl::IsInvalidArgument(s) ? 2 : 1;
  }
  return 0;
}
