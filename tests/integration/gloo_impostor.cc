// Stands in for one node's rank in a lane's gloo rendezvous of a spanning group, through the
// job's store as the SDK does (client/src/span_agreement.cc), and then sends the wrong proof:
// the process a token check must refuse. Run while that node's own ranks have joined but not
// yet made their first collective.
//
//   gloo_impostor GROUP FORMATION NODES NODE_INDEX LANE
//
// Connects to $COMMD_RUNTIME_DIR as job $COMMD_JOB_ID, puts its own proofs in the store (as an
// honest rank does), connects the full mesh, sends every peer 32 bytes of 'x' instead, and
// prints "impostor connected" then "impostor done" (or "impostor failed <what>") and exits 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "commd/commd.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace {

// The job's store as gloo's rendezvous store, as the SDK's adapter keys it (blocking waits).
class JobStore : public gloo::rendezvous::Store {
 public:
  JobStore(commd::Store* store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(prefix_ + key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    auto v = store_->Get(prefix_ + key);
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    Check(store_->Wait(full, absl::Seconds(60)));
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);
  }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }
  commd::Store* store_;
  std::string prefix_;
};

}  // namespace

int main(int argc, char** argv) {
  int nodes = 0, node = 0, lane = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[3], &nodes) || !absl::SimpleAtoi(argv[4], &node) ||
      !absl::SimpleAtoi(argv[5], &lane) || nodes < 2 || node < 0 || node >= nodes) {
    std::fprintf(stderr, "usage: gloo_impostor GROUP FORMATION NODES NODE_INDEX LANE\n");
    return 2;
  }
  auto client = commd::Client::Connect();
  if (!client.ok()) {
    std::printf("impostor failed %s\n", client.status().ToString().c_str());
    return 1;
  }
  try {
    JobStore store(&(*client)->store(),
                   absl::StrCat("commd.span/", argv[1], "/", argv[2], "/", lane, "/"));
    const size_t proof = 32;
    // Proofs in the store as an honest rank's, so that only what crosses the wire is wrong.
    const std::string stored(proof * static_cast<size_t>(nodes), 'p');
    store.set(absl::StrCat("proof/", node), std::vector<char>(stored.begin(), stored.end()));
    gloo::transport::tcp::attr attr;
    attr.iface = "lo";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(node, nodes);
    context->setTimeout(std::chrono::seconds(60));
    context->connectFullMesh(store, device);
    std::printf("impostor connected\n");
    std::fflush(stdout);
    std::string sent(proof * static_cast<size_t>(nodes), 'x');
    std::vector<char> got(sent.size());
    gloo::AlltoallOptions opts(context);
    opts.setInput(sent.data(), sent.size());
    opts.setOutput(got.data(), got.size());
    gloo::alltoall(opts);
    std::printf("impostor done\n");
  } catch (const std::exception& e) {
    std::printf("impostor failed %s\n", e.what());
  }
  std::fflush(stdout);
  return 0;
}
