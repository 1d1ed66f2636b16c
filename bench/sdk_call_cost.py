#!/usr/bin/env python3
"""Instructions per SDK collective call, by function, independent of the machine's load.

Runs build/bench/sdk_call_cost (a world of one on a private commd) under
`valgrind --tool=callgrind --toggle-collect='*RunCalls*'` twice, with N and 2N calls, and
divides the difference by N: what is left is exactly one call's work (setup, warm-up and
first-call allocations cancel out; the 5000 warm-up calls fill the ring's first lap). The same again collecting only inside the kernel
(kernels::AllReducePrepared, which the SDK runs for a buffer's repeated all-reduce, or
kernels::Barrier) gives the kernel's share; the rest is what the SDK adds. Prints those and the functions' own (exclusive) instructions per call, largest first.

    bench/sdk_call_cost.py [--build build] [--mode sym|host|barrier ...] [--bytes 8]
                           [--calls 2000] [--top 25]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*?)\s*(\[.*\])?\s*$")


# Past the first lap of the ring at the daemon's default capacity (4096 entries): the steady
# state of a job, where an entry's slot already holds its group's names (control_block_writer.h).
WARMUP = 5000
KERNEL = {"sym": "AllReducePrepared", "host": "AllReducePrepared", "barrier": "Barrier"}


def profile(binary, mode, nbytes, calls, out_dir, collect="*RunCalls*"):
    out = os.path.join(out_dir, f"{mode}.{calls}.out")
    cmd = [
        "valgrind", "--tool=callgrind", f"--toggle-collect={collect}",
        f"--callgrind-out-file={out}", binary, "--mode", mode, "--bytes", str(nbytes),
        "--calls", str(calls), "--warmup", str(WARMUP)
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    text = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", out],
                          check=True, capture_output=True, text=True).stdout
    total, funcs = 0, {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        ir = int(m.group(1).replace(",", ""))
        name = m.group(2)
        if "PROGRAM TOTALS" in name:
            total = ir
        elif re.search(r"\([\d,]+x\)$", name):
            continue  # callgrind_annotate's per-call-count variant of a line listed as well
        elif ":" in name:
            # "path/file.cc:function": the same function may be listed per source file (code
            # inlined from headers); keep them apart, under the file's base name.
            path, func = name.split(":", 1)
            key = f"{os.path.basename(path)}:{func}"
            funcs[key] = funcs.get(key, 0) + ir
    return total, funcs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--mode", nargs="+", default=["sym", "host", "barrier"])
    p.add_argument("--bytes", type=int, default=8)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    binary = os.path.join(a.build, "bench", "sdk_call_cost")
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} not found: build the target sdk_call_cost first")
    with tempfile.TemporaryDirectory(prefix="sdk-call-cost") as tmp:
        for mode in a.mode:
            t1, f1 = profile(binary, mode, a.bytes, a.calls, tmp)
            t2, f2 = profile(binary, mode, a.bytes, 2 * a.calls, tmp)
            per_call = (t2 - t1) / a.calls
            kernel_fn = f"*commd::kernels::{KERNEL[mode]}(commd::kernels::HostCommView const&*"
            k1, _ = profile(binary, mode, a.bytes, a.calls, tmp, kernel_fn)
            k2, _ = profile(binary, mode, a.bytes, 2 * a.calls, tmp, kernel_fn)
            kernel = (k2 - k1) / a.calls
            print(f"== {mode}, {a.bytes} B: {per_call:.0f} Ir/call, of which the kernel "
                  f"(kernels::{KERNEL[mode]}) {kernel:.0f}: the SDK adds {per_call - kernel:.0f} "
                  f"(callgrind, {a.calls} vs {2 * a.calls} calls)")
            rows = []
            for name, ir2 in f2.items():
                d = (ir2 - f1.get(name, 0)) / a.calls
                if d >= 1:
                    rows.append((d, name))
            rows.sort(reverse=True)
            for d, name in rows[:a.top]:
                print(f"  {d:8.0f}  {name[:150]}")

if __name__ == "__main__":
    main()
