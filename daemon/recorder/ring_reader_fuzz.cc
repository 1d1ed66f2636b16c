// Fuzz target for the untrusting ring reader: any byte string is a control block mapping.
// Checks that reading, stamping and the dump encodings (JSON, and the pickle made from it)
// never crash, never read out of the buffer (ASan, in the libFuzzer build) and keep the
// snapshot's invariants.
//
//   libFuzzer (clang, -DCOMMD_FUZZ=ON):  ring_reader_fuzz -max_total_time=60 CORPUS SEEDS
//   plain (any compiler):                ring_reader_fuzz_driver SEEDS --mutations=4000
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/recorder/ring_reader.h"
#include "format/dump_json.h"
#include "format/pickle_writer.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void CheckSnapshot(const commd::RingSnapshot& s) {
  Check(s.entries.size() + s.invalid_entries <= s.ring_capacity);
  for (size_t i = 0; i < s.entries.size(); ++i) {
    const commd::RecordedEntry& e = s.entries[i];
    if (i > 0) Check(s.entries[i - 1].record_id < e.record_id);
    Check(e.input_sizes.size() <= commd::kRecordMaxTensors);
    Check(e.output_sizes.size() == e.output_dtypes.size());
    for (const auto& dims : e.input_sizes) Check(dims.size() <= commd::kRecordMaxDims);
    Check(e.pg_name.size() < commd::kRecordNameBytes * 4);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Shared memory is 8-byte aligned; the input is not.
  std::vector<uint64_t> buf(size / 8 + 1);
  std::memcpy(buf.data(), data, size);
  auto snap = commd::ReadControlBlock(buf.data(), size, {.max_tries = 2, .retry_budget = 64});
  if (!snap.ok()) return 0;
  CheckSnapshot(*snap);
  Check(commd::StampDiscoveries(buf.data(), size, 12345, &*snap).ok());
  auto again = commd::ReadControlBlock(buf.data(), size, {.max_tries = 2, .retry_budget = 64});
  Check(again.ok());
  CheckSnapshot(*again);
  // The watchdog's incremental read: from a record id, the newest few, chosen by the input.
  const uint64_t from = size >= 8 ? buf[0] % (again->next_record_id + 3) : 0;
  auto tail = commd::ReadControlBlock(buf.data(), size,
                                      {.max_tries = 2,
                                       .retry_budget = 64,
                                       .from_record_id = from,
                                       .max_entries = static_cast<uint32_t>(1 + size % 9)});
  Check(tail.ok());
  CheckSnapshot(*tail);
  for (const auto& e : tail->entries) Check(e.record_id >= from);
  Check(tail->entries.size() <= 1 + size % 9);
  commd::RankDumpInput in{.snapshot = &*again, .host = "fuzz", .pid = 1, .device = "host"};
  // What the dumper writes: the JSON must parse back (valid JSON, valid UTF-8), and the
  // pickle is made from it.
  const std::string json = commd::EncodeRankDumpJson(in, {.comm_lib_version = "fuzz"});
  Check(commd::EncodePickleFromJson(json).ok());
  return 0;
}
