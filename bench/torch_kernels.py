#!/usr/bin/env python3
"""PyTorch equivalents of bench_kernels (same shapes, same GPU, same run), for the ratios in
docs/CUDA_BACKEND.md:

  * causal GQA attention through SDPA's flash backend, fwd / bwd / fwd+bwd, B=8 T=2048 H=32 KVH=8
    hd=128 (and hd=64), q/k/v viewed from the [B, T, heads, hd] layout the backend uses;
  * unfused head: logits = x @ w^T (bf16), F.cross_entropy fwd+bwd, N=16384 H=4096 V=128256, with
    and without HF's fp32 upcast of the logits; time and peak extra memory;
  * a device-to-device copy (bytes read + written), as a cross-check of the bandwidth ceiling.

Timing: CUDA events, warm-up, median. Prints RESULT lines like bench_kernels.
"""
import math
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, warm=3, iters=20):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def bench_attn(B, T, H, KVH, hd):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = "cuda"
    dt = torch.bfloat16
    # The backend's layout: [B*T, heads*hd] = [B, T, heads, hd]; SDPA wants [B, heads, T, hd] views.
    q = torch.randn(B, T, H, hd, device=dev, dtype=dt).transpose(1, 2).requires_grad_()
    k = torch.randn(B, T, KVH, hd, device=dev, dtype=dt).transpose(1, 2).requires_grad_()
    v = torch.randn(B, T, KVH, hd, device=dev, dtype=dt).transpose(1, 2).requires_grad_()
    dout = torch.randn(B, T, H, hd, device=dev, dtype=dt).transpose(1, 2)
    mode = "enable_gqa"

    def run_fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            if mode == "enable_gqa":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, ke, ve, is_causal=True)

    try:
        run_fwd()
    except Exception as e:  # flash backend without GQA support: expand K/V outside the timing
        print(f"  (flash + enable_gqa unavailable: {type(e).__name__}; K/V expanded to {H} heads)")
        mode = "expand"
        ke = k.detach().repeat_interleave(H // KVH, dim=1).requires_grad_()
        ve = v.detach().repeat_interleave(H // KVH, dim=1).requires_grad_()
    out = run_fwd()

    def fwd():
        with torch.no_grad():
            run_fwd()

    def bwd():
        torch.autograd.grad(out, (q, k, v) if mode == "enable_gqa" else (q, ke, ve), dout, retain_graph=True)

    def fwdbwd():
        o = run_fwd()
        torch.autograd.grad(o, (q, k, v) if mode == "enable_gqa" else (q, ke, ve), dout)

    t_f = median_ms(fwd)
    t_b = median_ms(bwd)
    t_fb = median_ms(fwdbwd)
    flops = 4.0 * B * H * T * T * hd / 2.0
    print(f"torch SDPA flash B={B} T={T} H={H} KVH={KVH} hd={hd} ({mode}): fwd {t_f:.3f} ms ({flops / t_f * 1e-9:.1f} TF/s), "
          f"bwd {t_b:.3f} ms ({2.5 * flops / t_b * 1e-9:.1f} TF/s), fwd+bwd {t_fb:.3f} ms ({3.5 * flops / t_fb * 1e-9:.1f} TF/s)")
    print(f"RESULT torch_attn_hd{hd}_fwd_ms={t_f:.3f} torch_attn_hd{hd}_bwd_ms={t_b:.3f} torch_attn_hd{hd}_fwdbwd_ms={t_fb:.3f}")


def bench_ce(N=16384, H=4096, V=128256):
    dev = "cuda"
    dt = torch.bfloat16
    x = (torch.rand(N, H, device=dev, dtype=dt) * 2 - 1).requires_grad_()
    w = ((torch.rand(V, H, device=dev, dtype=dt) * 2 - 1) * 0.02).requires_grad_()
    labels = torch.randint(0, V, (N,), device=dev)
    labels[torch.rand(N, device=dev) < 0.1] = -100
    logits_bytes = N * V * 2
    for upcast in (True, False):

        def step():
            logits = x @ w.t()
            if upcast:
                logits = logits.float()
            loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / N
            loss.backward()

        step()  # allocates x.grad / w.grad once: later steps accumulate into them
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        t = median_ms(step, warm=2, iters=7)
        tag = "fp32 upcast (HF)" if upcast else "bf16 logits"
        print(f"torch unfused linear+CE [{tag}]: {t:.2f} ms, peak extra memory {extra / 2**20:.0f} MiB "
              f"= {extra / logits_bytes:.3f} of the bf16 logits")
        key = "upcast" if upcast else "bf16"
        print(f"RESULT torch_ce_{key}_ms={t:.2f} torch_ce_{key}_extra_mib={extra / 2**20:.0f}")
    del x, w
    torch.cuda.empty_cache()


def bench_copy():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    t = median_ms(lambda: b.copy_(a))
    print(f"torch d2d copy 1 GiB: {t:.3f} ms, {2 * n / t * 1e-6:.0f} GB/s")
    print(f"RESULT torch_copy_gbs={2 * n / t * 1e-6:.0f}")


def main():
    want = set(sys.argv[1:]) or {"attn", "ce", "copy"}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    torch.manual_seed(0)
    if "copy" in want:
        bench_copy()
    if "attn" in want:
        bench_attn(8, 2048, 32, 8, 128)
        bench_attn(8, 2048, 32, 8, 64)
    if "ce" in want:
        bench_ce()


if __name__ == "__main__":
    main()
