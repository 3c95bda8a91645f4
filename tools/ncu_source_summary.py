#!/usr/bin/env python3
"""Summary of one kernel's per-instruction ncu counts (issue 19's way of finding instruction excess).

  ncu --section SourceCounters ... -o R BINARY ARGS
  ncu -i R.ncu-rep --page source --csv --print-source sass > R.csv
  python3 tools/ncu_source_summary.py R.csv [--top N] [--min-count C]

Prints the instructions executed by opcode (with their share of the stall samples), the stall
reasons over all samples, the N instructions with the most samples (with their top three stall
reasons), and with --min-count C every instruction executed at least C times in address order (the
per-tile loop of a kernel: its instructions run tiles x warps times).
"""
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path)))
    hdr = rows[1]  # rows[0] names the kernel
    ix = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[2:]:
        if len(r) < len(hdr) or not r[ix["Source"]].strip():
            continue
        out.append({
            "addr": r[ix["Address"]],
            "sass": r[ix["Source"]].strip(),
            "count": int(r[ix["Instructions Executed"]] or 0),
            "samples": int(r[ix["Warp Stall Sampling (All Samples)"]] or 0),
            "stalls": {c[len("stall_"):]: int(r[ix[c]] or 0) for c in stall_cols},
        })
    return rows[0], out


def opcode(sass):
    words = sass.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    min_count = int(sys.argv[sys.argv.index("--min-count") + 1]) if "--min-count" in sys.argv else 0
    kernel, ins = load(sys.argv[1])
    total = sum(i["count"] for i in ins)
    samples = max(1, sum(i["samples"] for i in ins))
    print(",".join(kernel)[:300])
    print(f"instructions executed {total:,}, stall samples {samples:,}")
    by_op, op_samples = collections.Counter(), collections.Counter()
    for i in ins:
        by_op[opcode(i["sass"])] += i["count"]
        op_samples[opcode(i["sass"])] += i["samples"]
    for op, n in by_op.most_common(40):
        print(f"  {op:12s} {n:13,d} {100 * n / max(total, 1):5.1f} %   samples {100 * op_samples[op] / samples:5.1f} %")
    stalls = collections.Counter()
    for i in ins:
        stalls.update(i["stalls"])
    print("stall reasons:")
    for reason, n in stalls.most_common(12):
        print(f"  {reason:20s} {100 * n / samples:5.1f} %")
    print(f"the {top} instructions with the most samples:")
    for i in sorted(ins, key=lambda i: -i["samples"])[:top]:
        worst = sorted(i["stalls"].items(), key=lambda kv: -kv[1])[:3]
        print(f"  {100 * i['samples'] / samples:5.1f} % {i['addr'][-5:]} {i['count']:10,d} {i['sass'][:60]:60s} {worst}")
    if min_count:
        print(f"instructions executed at least {min_count:,} times:")
        for i in ins:
            if i["count"] >= min_count:
                print(f"  {i['addr'][-5:]} {i['count']:10,d} {i['samples']:6d} {i['sass']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
