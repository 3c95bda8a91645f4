#!/usr/bin/env python3
"""Reads the RESULT lines and JSON lines of one bench/run_all.sh log and prints each issue target
with its measured ratio (slideformer vs the reference measured in the same run)."""
import json
import re
import sys


def main(path):
    r = {}
    train = {}
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("RESULT "):
            for kv in line[7:].split():
                k, _, v = kv.partition("=")
                try:
                    r[k] = float(v)
                except ValueError:
                    pass
        elif line.startswith("{") and line.endswith("}"):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if "tokens_per_second" in j:
                train["sf"] = j["tokens_per_second"]
            if "tokens_per_s" in j:
                train["torch"] = j["tokens_per_s"]
    rows = []

    def add(name, value, target, ok, note=""):
        rows.append((name, value, target, "met" if ok else "MISSED", note))

    for hd in (128, 64):
        a, t = r.get(f"attn_hd{hd}_fwdbwd_ms"), r.get(f"torch_attn_hd{hd}_fwdbwd_ms")
        if a and t:
            add(f"attention hd{hd} fwd+bwd speed vs torch SDPA", f"{t / a:.3f}x", ">= 0.8x", t / a >= 0.8,
                f"sf {a:.3f} ms, torch {t:.3f} ms")
    for k, v in sorted(r.items()):
        m = re.match(r"(rmsnorm|rope|swiglu)_(fwd|bwd)\[[^\]]*\]_pct_copy$", k)
        if m:
            add(f"{m.group(1)} {m.group(2)} % of copy bandwidth", f"{v:.1f}%", ">= 80%", v >= 80)
    if "ce_dwbf16_ms" in r:
        for key in ("bf16", "upcast"):
            t = r.get(f"torch_ce_{key}_ms")
            if t:
                q = r["ce_dwbf16_ms"] / t
                add(f"linear-CE time vs torch unfused ({key})", f"{q:.3f}x", "<= 1.2x", q <= 1.2,
                    f"sf {r['ce_dwbf16_ms']:.1f} ms, torch {t:.1f} ms")
        frac = r.get("ce_extra_frac", r.get("ce_ws_frac"))
        add("linear-CE peak extra memory / logits", f"{frac:.4f}", "<= 0.125", frac <= 0.125)
    if "gemm_sf_tflops" in r:
        q = r["gemm_sf_tflops"] / r["gemm_cublas_tflops"]
        add("GEMM TFLOP/s vs cuBLAS", f"{q:.3f}x", "~1x", q >= 0.95,
            f"sf {r['gemm_sf_tflops']:.0f}, cuBLAS {r['gemm_cublas_tflops']:.0f} TFLOP/s")
    if "sf" in train and "torch" in train:
        q = train["sf"] / train["torch"]
        add("1B in-memory training tokens/s vs PyTorch eager", f"{q:.3f}x", ">= 1.2x", q >= 1.2,
            f"sf {train['sf']:.0f}, torch {train['torch']:.0f} tok/s")
    w = max([len(x[0]) for x in rows] + [10])
    for name, value, target, verdict, note in rows:
        print(f"{name:<{w}}  {value:>9}  {target:>8}  {verdict:<6}  {note}")
    return 0 if all(x[3] == "met" for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
