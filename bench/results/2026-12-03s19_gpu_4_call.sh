#!/bin/bash
# session 19 call 4: attention at head dim 256 (Gemma 3; the sm_80 kernel family on every GPU)
# against torch SDPA's backends, Gemma 3 4B's heads (8 query, 4 K/V), B 8 x T 2048, with parity
# of odd hd-256 shapes first; then the same at the 3B's hd 128 shape for the lease's reference.
tar xJf gpupack/attn.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
timeout 240 python3 bench/attn_vs_torch.py gpubin --head-dims 256 --shapes 8,2048,8,4 > $L/attn_hd256.log 2>&1; echo "hd256 rc=$?"
grep -E "RESULT|hd 256|parity" $L/attn_hd256.log | tail -20
timeout 150 python3 bench/attn_vs_torch.py gpubin --head-dims 128 --no-parity > $L/attn_hd128.log 2>&1; echo "hd128 rc=$?"
grep -E "RESULT|hd 128" $L/attn_hd128.log | tail -10
