// Writes the ring reader's seed corpus: valid control blocks (small rings, deterministic
// clock) and one corrupted variant per kind of damage the reader must survive.
//
//   ring_corpus_gen tests/fixtures/ring_corpus
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "daemon/recorder/ring_reader.h"
#include "daemon/recorder/ring_test_util.h"

namespace {

using commd::ControlBlockHeader;
using commd::RingEntry;
using commd::testing::TestBlock;

void Write(const std::string& dir, const std::string& name, const char* data, size_t n) {
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(n));
}

// A cap-8 block with a mix of 6 entries, damaged by `corrupt`.
void Damaged(const std::string& dir, const std::string& name,
             const std::function<void(TestBlock&)>& corrupt) {
  TestBlock b(8);
  commd::testing::RecordMix(*b.Writer(), 6);
  corrupt(b);
  Write(dir, name, b.base(), b.bytes);
}

ControlBlockHeader* H(TestBlock& b) { return reinterpret_cast<ControlBlockHeader*>(b.base()); }

void Valid(const std::string& dir) {
  {
    TestBlock b(8);
    Write(dir, "valid_cap8_empty", b.base(), b.bytes);
  }
  {
    TestBlock b(4, 1, 2, 1);
    commd::testing::RecordMix(*b.Writer(), 7);  // wrapped
    Write(dir, "valid_cap4_wrapped", b.base(), b.bytes);
  }
  {
    TestBlock b(16, 2, 4, 6);
    auto w = b.Writer();
    commd::testing::RecordMix(*w, 12, 4);
    auto s = commd::ReadControlBlock(b.base(), b.bytes);
    if (s.ok()) (void)commd::StampDiscoveries(b.base(), b.bytes, 2'000'000, &*s);
    commd::RequestAbort(b.base(), b.bytes, commd::AbortReason::kStuck, "seq 3 stuck", 3'000'000);
    Write(dir, "valid_cap16_stamped_aborted", b.base(), b.bytes);
  }
  {
    TestBlock b(4);
    auto w = b.Writer();
    auto pg = w->RegisterProcessGroup(9, std::string(70, 'g') + "\xc3\xa9", "tensor_parallel");
    const int64_t six[] = {2, 3, 4, 5, 6, 7};
    std::vector<commd::TensorDesc> ts(10, {.dims = six, .ndim = 6});
    w->Begin({.op = commd::CollectiveOp::kAllGatherCoalesced,
              .pg = pg.ok() ? *pg : 0,
              .inputs = ts,
              .outputs = ts});
    Write(dir, "valid_cap4_truncated", b.base(), b.bytes);
  }
}

void Corrupted(const std::string& dir) {
  Damaged(dir, "bad_magic", [](TestBlock& b) { H(b)->magic = 0; });
  Damaged(dir, "bad_version", [](TestBlock& b) { H(b)->abi_version = 77; });
  Damaged(dir, "bad_capacity_not_pow2", [](TestBlock& b) { H(b)->ring_capacity = 7; });
  Damaged(dir, "bad_capacity_huge", [](TestBlock& b) { H(b)->ring_capacity = 1u << 30; });
  Damaged(dir, "bad_capacity_beyond_mapping", [](TestBlock& b) {
    H(b)->ring_capacity = 64;
    H(b)->total_bytes = commd::ControlBlockBytes(64);
    H(b)->discovery_offset = commd::DiscoveryOffset(64);
  });
  Damaged(dir, "bad_total_bytes", [](TestBlock& b) { H(b)->total_bytes = ~0ull; });
  Damaged(dir, "bad_ring_offset", [](TestBlock& b) { H(b)->ring_offset = 1ull << 40; });
  Damaged(dir, "bad_rank", [](TestBlock& b) { H(b)->rank = -1; });
  Damaged(dir, "entry_seq_odd", [](TestBlock& b) { b.entry(0)->seq |= 1; });
  Damaged(dir, "entry_record_id", [](TestBlock& b) { b.entry(1)->record_id = 1ull << 62; });
  Damaged(dir, "entry_state", [](TestBlock& b) { b.entry(0)->state = 200; });
  Damaged(dir, "entry_op", [](TestBlock& b) { b.entry(1)->op = 0xffff; });
  Damaged(dir, "entry_flags", [](TestBlock& b) { b.entry(2)->flags = 0xff; });
  Damaged(dir, "entry_counts", [](TestBlock& b) { b.entry(0)->num_inputs = 255; });
  Damaged(dir, "entry_dims", [](TestBlock& b) { b.entry(1)->output_ndims[0] = 200; });
  Damaged(dir, "entry_negative_dim", [](TestBlock& b) { b.entry(0)->input_dims[0][0] = -1; });
  Damaged(dir, "entry_dtype", [](TestBlock& b) { b.entry(0)->input_dtypes[0] = 99; });
  Damaged(dir, "entry_name", [](TestBlock& b) {
    std::memset(b.entry(0)->pg_name, 0xfe, sizeof(b.entry(0)->pg_name));
  });
  Damaged(dir, "entry_peer", [](TestBlock& b) { b.entry(2)->peer = 1 << 30; });
  Damaged(dir, "next_record_id_huge", [](TestBlock& b) {
    *reinterpret_cast<uint64_t*>(b.base() + commd::kRingStateOffset) = ~0ull;
  });
  Damaged(dir, "random_ring", [](TestBlock& b) {
    std::mt19937_64 rng(3);
    for (size_t i = commd::kRingOffset; i < b.bytes; ++i) b.base()[i] = char(rng());
  });
  TestBlock b(8);
  commd::testing::RecordMix(*b.Writer(), 6);
  Write(dir, "short_mapping", b.base(), commd::kRingOffset + 100);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  Valid(argv[1]);
  Corrupted(argv[1]);
  return 0;
}
