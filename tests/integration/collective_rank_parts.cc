// Modes of collective_rank for collectives recorded as parts of one flight-recorder entry
// (CollectiveOptions::part_of): a chunked all-reduce recorded by hand, the ids a part may not
// name, and a NaN in one part under policy FAIL.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/integration/collective_rank.h"

namespace collective_rank {
namespace {

constexpr size_t kPart = 1000;  // elements of each part
constexpr int kParts = 3;

// The whole collective's entry, as one all-reduce of kParts * kPart float32 would record it.
commd::RecordId BeginWhole(Run& run, size_t count) {
  const int64_t dims[] = {static_cast<int64_t>(count)};
  const commd::TensorDesc t{dims, 1, DataType::kFloat32};
  commd::Recorder& rec = run.g.recorder();
  const commd::RecordId id = rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
  rec.Started(id);
  return id;
}

// Part p of a chunked all-reduce: kPart inputs of tag p reduced in run.in, checked.
absl::Status ReducePart(Run& run, int p, const commd::CollectiveOptions& o) {
  for (size_t i = 0; i < kPart; ++i) {
    Store(run.in.data(), i, DataType::kFloat32,
          Input(run, run.args.rank, p, i, DataType::kFloat32));
  }
  absl::Status s = run.g.AllReduce(run.in, kPart, DataType::kFloat32, ReduceOp::kSum, o);
  if (s.ok()) {
    ExpectReduced(run, absl::StrCat("part ", p), run.in.data(), p, 0, kPart, DataType::kFloat32,
                  ReduceOp::kSum);
  }
  return s;
}

}  // namespace

// One entry of kParts * kPart elements for kParts all-reduces, completed by hand; then ids a
// part may not name (nothing recorded for them); then one all-reduce with its own entry.
// The test reads the dump: exactly those two entries.
void PartOf(Run& run) {
  const commd::RecordId whole = BeginWhole(run, kParts * kPart);
  if (whole.collective_seq_id != 1) run.Fail(absl::StrCat("seq ", whole.collective_seq_id));
  const commd::CollectiveOptions o{.part_of = whole};
  for (int p = 0; p < kParts; ++p) run.Check("part", ReducePart(run, p, o));
  run.g.recorder().Completed(whole);
  // Retired, never begun, and a p2p entry's id (no collective seq): INVALID_ARGUMENT naming
  // the id, on every rank alike (no rank waits for another).
  ExpectInvalid(run, "completed part_of",
                run.g.AllReduce(run.in, kPart, DataType::kFloat32, ReduceOp::kSum, o),
                absl::StrCat("part_of record ", whole.record_id,
                             " (collective seq 1) is not a "
                             "pending collective entry of group c")
                    .c_str());
  commd::CollectiveOptions never{.part_of =
                                     commd::RecordId{.record_id = 77, .collective_seq_id = 9}};
  ExpectInvalid(run, "unknown part_of",
                run.g.AllGather(run.in, run.out, kPart, DataType::kFloat32, never),
                "all-gather: part_of record 77 (collective seq 9) is not a pending");
  ExpectInvalid(run, "default part_of",
                run.g.AllReduce(run.in, kPart, DataType::kFloat32, ReduceOp::kSum,
                                {.part_of = commd::RecordId{}}),
                "part_of record 18446744073709551615");
  run.Check("own entry", ReducePart(run, kParts, {}));
}

// Policy FAIL: NaN/Inf in rank 1's second part fails that part with DATA_LOSS on every rank,
// naming the whole collective's seq; its entry is flagged and abandoned by the caller, and
// the group's next collective (its own entry, seq 2) runs.
void PartOfNanFail(Run& run) {
  const commd::RecordId whole = BeginWhole(run, kParts * kPart);
  const commd::CollectiveOptions o{.part_of = whole};
  run.Check("clean part", ReducePart(run, 0, o));
  for (size_t i = 0; i < kPart; ++i) static_cast<float*>(run.in.data())[i] = 1.0f;
  if (run.args.rank == 1) static_cast<float*>(run.in.data())[5] = NAN;
  const absl::Status s = run.g.AllReduce(run.in, kPart, DataType::kFloat32, ReduceOp::kSum, o);
  if (s.code() != absl::StatusCode::kDataLoss ||
      s.message().find("all_reduce seq 1") == absl::string_view::npos ||
      s.message().find("first rank 1") == absl::string_view::npos) {
    run.Fail("nan part: " + s.ToString());
  } else {
    std::printf("rank %d: %s\n", run.args.rank, s.ToString().c_str());
  }
  run.g.recorder().Abandoned(whole);
  run.Check("after the failed collective", ReducePart(run, 1, {}));
}

}  // namespace collective_rank
