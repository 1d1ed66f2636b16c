#!/bin/sh
# commd-bench --path sdk,kernel: both paths in one run, interleaved in rounds. Asserts the
# output's structure (one row per size, the round count, both paths' times present, the
# ratio's median between its lowest and highest), that both paths ran the same all-reduce
# algorithm at every size (one-shot and two-shot both covered), and that --check found no
# wrong element on either path; never a timing.
#   interleaved_test.sh path/to/commd-bench
set -eu
bench="$1"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

out=$("$bench" -n 2 -b 8 -e 32K -f 64 -w 2 -i 5 --rounds 3 -c --path sdk,kernel --csv) ||
  fail "all-reduce run exited $?"
echo "$out"
echo "$out" | grep -q '^# commd-bench: allreduce, path sdk,kernel (Group::AllReduce, kernels::AllReduce; 3 alternating rounds per size)' ||
  fail "no header line naming both paths"
echo "$out" | awk -F, '
  /^#/ { next }
  /^op,/ {
    if ($0 != "op,ranks,size,count,type,redop,algo_sdk,algo_kernel,rounds,sdk_us,kernel_us,ratio,ratio_lo,ratio_hi,wrong") {
      print "bad CSV header: " $0; bad = 1
    }
    header = 1; next
  }
  {
    rows++
    if (NF != 15) { print "row with " NF " fields: " $0; bad = 1 }
    if ($1 != "allreduce" || $2 != 2) { print "wrong op or ranks: " $0; bad = 1 }
    if ($7 != $8) { print "paths ran different algorithms: " $0; bad = 1 }
    algos[$7] = 1
    if ($9 != 3) { print "rounds not 3: " $0; bad = 1 }
    if (!($10 > 0 && $11 > 0 && $12 > 0)) { print "a time or ratio missing: " $0; bad = 1 }
    if (!($13 <= $12 && $12 <= $14)) { print "median ratio outside its range: " $0; bad = 1 }
    if ($15 != "0") { print "wrong elements: " $0; bad = 1 }
    sizes = sizes " " $3
  }
  END {
    if (!header) { print "no CSV header"; bad = 1 }
    if (sizes != " 8 512 32768") { print "sizes" sizes ", want 8 512 32768"; bad = 1 }
    if (!algos["oneshot"] || !algos["twoshot"]) { print "one-shot and two-shot not both run"; bad = 1 }
    exit bad
  }' || fail "all-reduce rows"

out=$("$bench" -n 2 -w 1 -i 5 --rounds 2 --op barrier --path kernel,sdk) ||
  fail "barrier run exited $?"
echo "$out"
rows=$(echo "$out" | awk '!/^#/ && $1 == "0" && $5 == "-" && $6 == "-" && $7 == 2 { n++ } END { print n + 0 }')
[ "$rows" = 1 ] || fail "barrier: want one table row of size 0, algorithm - on both paths, 2 rounds"
echo PASS
