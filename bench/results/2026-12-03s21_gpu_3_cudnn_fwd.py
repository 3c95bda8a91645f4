# One causal GQA forward (and backward) through torch SDPA's cuDNN backend, for ncu to profile.
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
hd = int(sys.argv[1])
q = torch.randn(8, 32, 2048, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(8, 8, 2048, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(8, 8, 2048, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o.backward(torch.ones_like(o))
torch.cuda.synchronize()
