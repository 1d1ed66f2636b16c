// commctl's command line (commands.h): the --help text and the global options' parser.
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tools/commctl/commands.h"

namespace commd::ctl {

const char* Usage() {
  return R"(Usage: commctl [--runtime-dir DIR] [--json] [--timeout SECONDS] COMMAND

Inspect and control the commd daemon on this node.

Commands:
  status    daemon version, uptime, sessions, groups, memory in use, CUDA
  topo      GPU/NIC link matrix (nvidia-smi topo -m vocabulary) and classification
  groups    groups with their state, ranks and processes (all jobs when run as root)
  dump [--job J] [--group G] [--local]
            write a flight-recorder dump of the formed groups into the daemon's dump dir
            (as root without --job: every job). With a cluster, a dump of one job is
            announced: every node with ranks of the job dumps them under the dump id
            printed (--local: this node only)
  health [--job J] [--group G] [--cluster]
            each group's state (ok, suspect, hung, aborted) and the watchdog's last diagnosis
            (as root without --job: every job); --cluster: every node's view of the job's
            groups (each rank's last completed and entered collective), from etcd
  abort --group G [--job J] --reason TEXT
            abort a group: its ranks' collectives fail with ABORTED and TEXT
  cluster nodes [--limit N] [--after NAME]
            the cluster's nodes as this daemon follows them in etcd: live ones and those
            gone within the hour, each with its lease (TTL; what is left of it, for this
            node), metrics address and version; at most N (default and most 1000) by name,
            --after NAME for the next ones (answered from the daemon's view: costs etcd
            nothing)
  fr export --in DIR --out DIR [--format torch]
            convert a dump's JSON files into the pickles PyTorch's torchfrtrace reads
  fr collect --dump-id ID --out DIR SOURCE...
            put every node's files of one dump into DIR (one folder per group); each
            SOURCE is a node's dump dir (shared or copied), a job's folder in one, or the
            dump's folder itself; prints each group's global ranks and the ones missing

Options:
  --runtime-dir DIR   the daemon's runtime dir (default: $COMMD_RUNTIME_DIR, then
                      /run/commd as root, else $XDG_RUNTIME_DIR/commd, else /tmp/commd-$UID)
  --json              machine-readable output
  --timeout SECONDS   how long to wait for the daemon (default 5)
  -h, --help          print this help

Exit status: 0 on success, 1 when the command failed (one line on stderr says why),
2 on a usage error.
)";
}

absl::Status ParseArgs(int argc, const char* const* argv, GlobalOptions* options,
                       std::vector<std::string>* rest) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const bool has_inline = arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos;
    if (has_inline) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
    }
    auto take = [&]() -> absl::StatusOr<std::string> {
      if (has_inline) return value;
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      return std::string(argv[++i]);
    };
    if (arg == "--runtime-dir") {
      ASSIGN_OR_RETURN(options->runtime_dir, take());
    } else if (arg == "--json") {
      options->json = true;
    } else if (arg == "--timeout") {
      ASSIGN_OR_RETURN(std::string t, take());
      double seconds = 0;
      if (!absl::SimpleAtod(t, &seconds) || seconds <= 0 || seconds > 3600) {
        return absl::InvalidArgumentError(
            absl::StrCat("--timeout '", t, "' is not a number of seconds in (0, 3600]"));
      }
      options->timeout = absl::Seconds(seconds);
    } else if (arg == "--job") {
      ASSIGN_OR_RETURN(options->job, take());
    } else if (arg == "--group") {
      ASSIGN_OR_RETURN(options->group, take());
    } else if (arg == "--in") {
      ASSIGN_OR_RETURN(options->in_dir, take());
    } else if (arg == "--out") {
      ASSIGN_OR_RETURN(options->out_dir, take());
    } else if (arg == "--format") {
      ASSIGN_OR_RETURN(options->format, take());
    } else if (arg == "--dump-id") {
      ASSIGN_OR_RETURN(options->dump_id, take());
    } else if (arg == "--local") {
      options->local = true;
    } else if (arg == "--cluster") {
      options->cluster = true;
    } else if (arg == "--reason") {
      ASSIGN_OR_RETURN(options->reason, take());
    } else if (arg == "--limit") {
      ASSIGN_OR_RETURN(std::string n, take());
      if (!absl::SimpleAtoi(n, &options->limit) || options->limit == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--limit '", n, "' is not a number of nodes from 1 to 1000"));
      }
    } else if (arg == "--after") {
      ASSIGN_OR_RETURN(options->after, take());
    } else if (arg.rfind("-", 0) == 0 && arg != "-h" && arg != "--help") {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", arg, "'"));
    } else {
      rest->push_back(arg);
    }
  }
  return absl::OkStatus();
}

}  // namespace commd::ctl
