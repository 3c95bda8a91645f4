#!/usr/bin/env python3
"""The NVMe-tier bench against its plan (issue 17: tokens/s as the plan predicts, within 15 %).

Usage: nvme8_verdict.py ALL.LOG TRACE.jsonl [--min-ratio 0.85]
Reads the last bench JSON line of ALL.LOG (bench's stdout) and the SF_TRACE of that run; prints the
measured step against the plan, and the last step's phases against the plan's: the forward's end
beside the previous step's last update (the forward is disk-bound: it should end one layer and the
head after it), the head and backward, the disk's busy time and the final drain. Exit 1 when
measured / predicted tokens/s is under the ratio."""
import json
import sys


def main():
    log, trace = sys.argv[1], sys.argv[2]
    min_ratio = float(sys.argv[sys.argv.index("--min-ratio") + 1]) if "--min-ratio" in sys.argv else 0.85
    rows = [json.loads(l) for l in open(log) if l.startswith("{") and '"predicted_tokens_per_second"' in l]
    r = rows[-1]
    marks = [json.loads(l) for l in open(trace)]
    i0 = [i for i, m in enumerate(marks) if m["stream"] == "host" and m["what"] == "run"][-1]
    seg, t0 = marks[i0:], marks[i0]["t"]  # the last step's marks (as tools/trace_summary.py takes them)

    def at(stream, what):
        return next((m["t"] - t0 for m in seg if m["stream"] == stream and m["what"] == what), float("nan"))

    head, bwd0 = at("compute", "head"), at("compute", "backward 0")
    upd = [m["t"] - t0 for m in marks
           if m["stream"] == "opt" and m["what"].startswith("updated ") and t0 <= m["t"] <= t0 + head]
    ph = r["predicted_phases"]
    ratio = r["tokens_per_second"] / r["predicted_tokens_per_second"]
    print(f"measured {r['tokens_per_second']:.0f} tokens/s ({r['step_ms'] / 1e3:.2f} s a step) against the plan's "
          f"{r['predicted_tokens_per_second']:.0f} ({r['predicted_step_ms'] / 1e3:.2f} s): {ratio:.3f}")
    print(f"forward {head:.2f} s (plan {ph['forward_s']:.2f}, {ph['forward_bound']}); the previous step's last "
          f"update ended at {max(upd, default=0.0):.2f} s; head + backward {bwd0 - head:.2f} s "
          f"(plan {ph['head_s'] + ph['backward_s']:.2f})")
    moved = (r["disk_read_bytes_per_step"] + r["disk_written_bytes_per_step"]) / 1e9
    print(f"disk: {moved:.1f} GB a step in {r['disk_busy_ms'] / 1e3:.2f} s busy ({moved / r['disk_busy_ms'] * 1e3:.2f} GB/s "
          f"mixed), the plan's disk time {r['predicted_disk_ms'] / 1e3:.2f} s (busy / plan "
          f"{r['disk_busy_ms'] / r['predicted_disk_ms']:.2f}); {r['disk_lent_pieces_per_step']:.0f} pieces read into "
          f"lent checkpoints; the last update drained in {r['drain_ms'] / 1e3:.2f} s")
    sys.exit(0 if ratio >= min_ratio else 1)


if __name__ == "__main__":
    main()
