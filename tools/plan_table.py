#!/usr/bin/env python3
"""The table of `plan` predictions in docs/HARDWARE.md: every preset of the seed paper's sizes on
every shipped hardware profile, 8 x 2048 tokens, clipping at 1.0.

    tools/plan_table.py build/slideformer [extra plan options, e.g. --offload-dir /mnt/nvme]
"""
import json
import subprocess
import sys

MODELS = ["llama-3b", "llama-8b", "llama-13b", "mistral-24b", "llama-70b", "mistral-123b"]
PROFILES = ["rtx4090", "a100-80gb"]
GIB = 2 ** 30


def plan(binary, model, profile, extra):
    cmd = [binary, "plan", "--preset", model, "--hardware", profile, "--batch-size", "8", "--seq-len", "2048",
           "--max-grad-norm", "1.0"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary, extra = sys.argv[1], sys.argv[2:]
    print("| profile | model | fits | engine | GPU | host | disk | tokens/s (K=1) | tokens/s (K=8) | step s: GPU / host / PCIe / disk |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for profile in PROFILES:
        for model in MODELS:
            j = plan(binary, model, profile, extra)
            k = {r["grad_accum"]: r for r in j["grad_accum_table"]}
            engine = j["engine"] if j["engine"] == "resident" else \
                f"sliding, {j['slots']} slots, {len(j['gpu_blobs'])} blobs on GPU"
            if j["micro_batch"] != 8:
                engine += f", micro-batches of {j['micro_batch']}"
            fits = "yes" if j["fits"] else "no: " + j["why"]
            tps8 = f"{k[8]['predicted_tokens_per_second']:.0f}" + ("" if k[8]["fits"] else " (does not fit)")
            print(f"| {profile} | {model} | {fits} | {engine} | {j['gpu_bytes'] / GIB:.1f} GiB | "
                  f"{j['host_bytes'] / GIB:.0f} GiB | {j.get('disk_bytes', 0) / GIB:.0f} GiB | "
                  f"{j['predicted_tokens_per_second']:.0f} | {tps8} | "
                  f"{j['predicted_gpu_s']:.2f} / {j['predicted_host_s']:.2f} / {j['predicted_pcie_s']:.2f} / "
                  f"{j.get('predicted_disk_s', 0):.2f} |")


if __name__ == "__main__":
    main()
