#!/usr/bin/env python3
"""Where a sliding-engine step's time goes, from an SF_TRACE file (src/engine/step_trace.h).

Usage: trace_summary.py TRACE.jsonl [--layers]
Per step (from the host's `run` mark to the next one), times in ms from the step's start:
the forward's end (head), the backward's end (backward 0), the norm on the host, when the host
optimizer's last update of the step ended, and how busy it was; with --layers, each layer's
compute gaps (a long gap = the compute stream waited for an upload or an update)."""
import json
import sys


def main():
    path = sys.argv[1]
    marks = [json.loads(line) for line in open(path)]
    starts = [i for i, m in enumerate(marks) if m["stream"] == "host" and m["what"] == "run"]
    print(f"{'step':>4} {'ms':>7} {'fwd0':>6} {'head':>7} {'bwd0':>7} {'norm':>7} {'opt_end':>8} "
          f"{'opt_busy':>8} {'p_end':>7}")
    for n, i0 in enumerate(starts):
        i1 = starts[n + 1] if n + 1 < len(starts) else len(marks)
        t0 = marks[i0]["t"]
        t1 = marks[i1]["t"] if i1 < len(marks) else None
        seg = marks[i0:i1]

        def at(stream, what):
            for m in seg:
                if m["stream"] == stream and m["what"] == what:
                    return (m["t"] - t0) * 1e3
            return float("nan")

        # The optimizer stream's work is queued in one step and may run into the next: take the
        # marks by time, between this step's start and the next's.
        opt = [m for m in marks if m["stream"] == "opt" and t0 <= m["t"] < (t1 if t1 else 1e30)]
        busy, begin, opt_end, p_end = 0.0, {}, float("nan"), float("nan")
        for m in opt:
            w = m["what"]
            if w.startswith("update "):
                begin[w[7:]] = m["t"]
            elif w.startswith("updated ") and w[8:] in begin:
                busy += m["t"] - begin.pop(w[8:])
                opt_end = (m["t"] - t0) * 1e3
                if not w.endswith("moments"):
                    p_end = opt_end
        step_ms = (t1 - t0) * 1e3 if t1 else float("nan")
        print(f"{n:>4} {step_ms:>7.1f} {at('compute', 'forward 0'):>6.1f} {at('compute', 'head'):>7.1f} "
              f"{at('compute', 'backward 0'):>7.1f} {at('host', 'norm known'):>7.1f} {opt_end:>8.1f} "
              f"{busy * 1e3:>8.1f} {p_end:>7.1f}")
        if "--layers" in sys.argv:
            comp = [m for m in seg if m["stream"] == "compute"]
            prev = t0
            row = []
            for m in comp:
                row.append(f"{m['what'].replace('forward ', 'f').replace('backward ', 'b')}:{(m['t'] - prev) * 1e3:.1f}")
                prev = m["t"]
            print("     " + " ".join(row))


if __name__ == "__main__":
    main()
