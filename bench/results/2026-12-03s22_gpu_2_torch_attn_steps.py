# torch SDPA forward + backward of one backend in attn_vs_torch.py's layout (the engine's
# [B, T, heads, hd] viewed as [B, heads, T, hd]), a few times, for ncu to list every kernel.
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
hd, backend = int(sys.argv[1]), getattr(SDPBackend, sys.argv[2])
B, T, H, KVH = 8, 2048, 32, 8
q = torch.randn(B, T, H, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
k = torch.randn(B, T, KVH, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
v = torch.randn(B, T, KVH, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
dout = torch.randn(B, T, H, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
with sdpa_kernel(backend):
    for _ in range(3):
        torch.cuda.nvtx.range_push("step")
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.autograd.grad(o, (q, k, v), dout)
        torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
