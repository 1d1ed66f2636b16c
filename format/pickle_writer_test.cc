#include "format/pickle_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace commd {
namespace {

using json = nlohmann::json;

bool HavePython() { return std::system("command -v python3 >/dev/null 2>&1") == 0; }

// Loads `pickle_bytes` with Python's pickle and returns json.dumps of the result.
std::string PythonLoadsAsJson(const std::string& pickle_bytes) {
  const std::string dir = ::testing::TempDir();
  const std::string in = dir + "/pickle_" + std::to_string(getpid()) + ".pkl";
  const std::string out = in + ".json";
  std::ofstream(in, std::ios::binary) << pickle_bytes;
  const std::string cmd =
      "python3 -c 'import json,pickle,sys; "
      "json.dump(pickle.load(open(sys.argv[1],\"rb\")), open(sys.argv[2],\"w\"))' " +
      in + " " + out;
  const int rc = std::system(cmd.c_str());
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  std::remove(in.c_str());
  std::remove(out.c_str());
  return rc == 0 ? text.str() : "python3 failed";
}

TEST(Pickle, GoldenBytesForScalars) {
  EXPECT_EQ(*EncodePickle(nullptr), std::string("\x80\x02N.", 4));
  EXPECT_EQ(*EncodePickle(true), std::string("\x80\x02\x88.", 4));
  EXPECT_EQ(*EncodePickle(5), std::string("\x80\x02K\x05.", 5));
  EXPECT_EQ(*EncodePickle(300), std::string("\x80\x02M\x2c\x01.", 6));
  EXPECT_EQ(*EncodePickle(-1), std::string("\x80\x02J\xff\xff\xff\xff.", 8));
  EXPECT_EQ(*EncodePickle("hi"), std::string("\x80\x02X\x02\x00\x00\x00hi.", 10));
  EXPECT_EQ(*EncodePickle(json::array()), std::string("\x80\x02].", 4));
  EXPECT_EQ(*EncodePickle(json::object()), std::string("\x80\x02}.", 4));
  // 2^63 as unsigned: 8 magnitude bytes plus a zero byte to stay positive.
  EXPECT_EQ(*EncodePickle(uint64_t{1} << 63),
            std::string("\x80\x02\x8a\x09\0\0\0\0\0\0\0\x80\0.", 14));
}

TEST(Pickle, RejectsBinaryAndDeepNesting) {
  EXPECT_EQ(EncodePickle(json::binary({1, 2})).status().code(), absl::StatusCode::kInvalidArgument);
  json deep = 1;
  for (int i = 0; i < 200; ++i) deep = json::array({deep});
  EXPECT_EQ(EncodePickle(deep).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Pickle, PythonLoadsWhatWeWrite) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not on PATH";
  json ints = json::array();
  for (int64_t v :
       {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{65535}, int64_t{65536}, int64_t{-1},
        int64_t{-128}, int64_t{-129}, int64_t{INT32_MIN}, int64_t{INT32_MAX},
        int64_t{INT32_MAX} + 1, int64_t{INT32_MIN} - 1, std::numeric_limits<int64_t>::min(),
        std::numeric_limits<int64_t>::max(), int64_t{-(int64_t{1} << 40)}, int64_t{1} << 55}) {
    ints.push_back(v);
  }
  ints.push_back(std::numeric_limits<uint64_t>::max());
  ints.push_back(uint64_t{1} << 63);
  const json value = {
      {"ints", ints},
      {"floats", {0.5, -1e300, 1.0 / 3, 0.0}},
      {"strings", {"", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "quote\"back\\slash\nnul"}},
      {"nested", {{"a", json::array({1, {{"b", json::array()}}})}, {"", json::object()}}},
      {"flags", {true, false, nullptr}},
  };
  auto bytes = EncodePickle(value);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string back = PythonLoadsAsJson(*bytes);
  ASSERT_TRUE(json::accept(back)) << back;
  EXPECT_EQ(json::parse(back), value) << back;
}

}  // namespace
}  // namespace commd
