// Runs LLVMFuzzerTestOneInput without libFuzzer: over every file of a seed directory, then
// over random mutations of them. Seeds named "valid_*" must also read back as valid blocks.
//
//   ring_reader_fuzz_driver tests/fixtures/ring_corpus --mutations=4000 [--seed=N]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "daemon/recorder/ring_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

bool ValidSeedReads(const Bytes& b) {
  std::vector<uint64_t> buf(b.size() / 8 + 1);
  std::memcpy(buf.data(), b.data(), b.size());
  auto s = commd::ReadControlBlock(buf.data(), b.size());
  return s.ok() && s->invalid_entries == 0;
}

// A few of the edits that matter to the reader: interesting words at word offsets, random
// bytes, bit flips, truncation.
void Mutate(Bytes& b, std::mt19937_64& rng) {
  static const uint64_t kWords[] = {
      0,    1,          2,          3,          7,          8,     64,
      0xff, 0x7fffffff, 0xffffffff, 1ull << 31, 1ull << 32, ~0ull, 0x8000000000000000ull};
  const int edits = 1 + int(rng() % 8);
  for (int k = 0; k < edits && !b.empty(); ++k) {
    const size_t at = rng() % b.size();
    switch (rng() % 5) {
      case 0:
        b[at] = uint8_t(rng());
        break;
      case 1:
        b[at] ^= uint8_t(1u << (rng() % 8));
        break;
      case 2:
      case 3: {
        const size_t word = at & ~size_t{7};
        const uint64_t v = kWords[rng() % std::size(kWords)];
        std::memcpy(&b[word], &v, std::min<size_t>(8, b.size() - word));
        break;
      }
      default:
        b.resize(at);
        break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SEED_DIR [--mutations=N] [--seed=N]\n", argv[0]);
    return 2;
  }
  long mutations = 4000;
  uint64_t seed = 1;
  for (int i = 2; i < argc; ++i) {
    if (std::strncmp(argv[i], "--mutations=", 12) == 0) mutations = std::atol(argv[i] + 12);
    if (std::strncmp(argv[i], "--seed=", 7) == 0) seed = std::strtoull(argv[i] + 7, nullptr, 10);
  }
  std::vector<std::filesystem::path> paths;
  for (const auto& f : std::filesystem::directory_iterator(argv[1])) {
    if (f.is_regular_file()) paths.push_back(f.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<Bytes> seeds;
  int bad_valid = 0;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    Bytes b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(b.data(), b.size());
    if (p.filename().string().rfind("valid_", 0) == 0 && !ValidSeedReads(b)) {
      std::fprintf(stderr, "seed %s should read as a valid block\n", p.c_str());
      ++bad_valid;
    }
    seeds.push_back(std::move(b));
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no seeds in %s\n", argv[1]);
    return 1;
  }
  std::mt19937_64 rng(seed);
  for (long i = 0; i < mutations; ++i) {
    Bytes b = seeds[rng() % seeds.size()];
    Mutate(b, rng);
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  std::printf("ran %zu seeds and %ld mutations\n", seeds.size(), mutations);
  return bad_valid == 0 ? 0 : 1;
}
