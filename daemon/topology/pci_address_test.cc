#include "daemon/topology/pci_address.h"

#include "gtest/gtest.h"

namespace commd::topology {
namespace {

TEST(PciAddressTest, NormalizesNvmlAndSysfsSpellings) {
  EXPECT_EQ(NormalizePciBusId("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(NormalizePciBusId("0000:1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(NormalizePciBusId("1b:00.1"), "0000:1b:00.1");
  EXPECT_EQ(NormalizePciBusId("0001:C3:1F.7"), "0001:c3:1f.7");
}

TEST(PciAddressTest, RejectsWhatIsNotABusId) {
  for (const char* bad : {"", "virtio2", "pci0000:00", "0000:1b:00", "0000:1b:20.0", "0000:1b:00.8",
                          "0000:100:00.0", "000000000:1b:00.0", "0000:1g:00.0"}) {
    EXPECT_FALSE(ParsePciBusId(bad).has_value()) << bad;
    EXPECT_EQ(NormalizePciBusId(bad), "") << bad;
  }
}

TEST(PciAddressTest, ParsesFields) {
  std::optional<PciAddress> a = ParsePciBusId("0002:c3:1f.5");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->domain, 2u);
  EXPECT_EQ(a->bus, 0xc3u);
  EXPECT_EQ(a->device, 0x1fu);
  EXPECT_EQ(a->function, 5u);
}

}  // namespace
}  // namespace commd::topology
