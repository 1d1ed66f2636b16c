#include "daemon/topology/fake_sysfs.h"

#include <stdlib.h>

#include <fstream>

#include "gtest/gtest.h"

namespace commd::topology {
namespace {

namespace fs = std::filesystem;

void WriteFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// class/<cls>/<name>/device -> ../../../devices/pci.../<bus id>
void LinkDevice(const fs::path& root, const fs::path& entry, const fs::path& device_rel) {
  fs::create_directories(root / entry);
  fs::create_symlink(fs::path("../../..") / device_rel, root / entry / "device");
}

}  // namespace

TempDir::TempDir() {
  std::string pattern = (fs::path(::testing::TempDir()) / "commd_topo_XXXXXX").string();
  char* made = mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << pattern;
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void BuildFakeSysfs(const fs::path& root, const nlohmann::json& nics) {
  for (const auto& nic : nics) {
    const std::string name = nic.at("name");
    const std::string kind = nic.at("kind");
    if (kind == "virtual") {  // like lo: a class/net entry with no device behind it
      WriteFile(root / "class/net" / name / "operstate", "unknown");
      continue;
    }
    const std::string bus_id = nic.at("bus_id");
    const fs::path device_rel = fs::path("devices") / ("pci" + bus_id.substr(0, 7)) / bus_id;
    fs::create_directories(root / device_rel);
    if (nic.contains("numa_node")) {
      WriteFile(root / device_rel / "numa_node", std::to_string(nic.at("numa_node").get<int>()));
    }
    if (kind == "infiniband") {
      const fs::path entry = fs::path("class/infiniband") / name;
      LinkDevice(root, entry, device_rel);
      WriteFile(root / entry / "ports/1/state", nic.at("state"));
      WriteFile(root / entry / "ports/1/rate", nic.at("rate"));
      if (nic.contains("netdev") && nic.at("netdev").is_string()) {
        const std::string netdev = nic.at("netdev");
        fs::create_directories(root / device_rel / "net" / netdev);
        LinkDevice(root, fs::path("class/net") / netdev, device_rel);
        WriteFile(root / "class/net" / netdev / "operstate", "up");
      }
    } else {
      const fs::path entry = fs::path("class/net") / name;
      LinkDevice(root, entry, device_rel);
      WriteFile(root / entry / "operstate", nic.at("operstate"));
      WriteFile(root / entry / "speed", nic.at("speed"));
    }
  }
}

nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path << " is not valid JSON";
  return j;
}

}  // namespace commd::topology
