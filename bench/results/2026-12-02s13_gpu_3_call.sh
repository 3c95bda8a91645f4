#!/bin/bash
# session 13 call 3 (last): h1's upload copies (GPU tests; OLMoE beside PyTorch, copies on/off; 3B
# all-host), h2's packed-row attention rework (its tests first in their own process, then per-token
# speed against unpacked rows), the rest of the GPU tests
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
G=gpubin/sf_gpu_tests; B=gpubin/slideformer
sumj() { python3 - "$1" <<'PY'
import json, sys
try: j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception as e: print(sys.argv[1].split('/')[-1], 'no JSON', e); sys.exit()
print(sys.argv[1].split('/')[-1], 'tok/s %.0f plan %.0f step_ms %.1f host_update_ms %.0f copies %s setup %.1f rss %.1f GB' % (j['tokens_per_second'], j['predicted_tokens_per_second'], j.get('step_ms', -1), j['host_update_ms'], j.get('upload_copy_bytes', j.get('upload_copies')), j.get('setup_s', 0), j.get('peak_rss_bytes', 0)/1e9))
PY
}
s t_copies 90 $G --gtest_brief=1 --gtest_filter='CudaUploadCopies.*:CudaEngines.*:CudaSelectiveRecompute.*'
grep -E "PASSED|FAILED|Failure|masters with copies|error" $L/t_copies.log | head -20; pack
s t_attn 120 $G --gtest_brief=1 --gtest_filter='CudaOps.Attention*:CudaPack*'
grep -E "PASSED|FAILED|Failure|error" $L/t_attn.log | head -12; pack
s t_rest 120 $G --gtest_brief=1 --gtest_filter='-CudaUploadCopies.*:CudaEngines.*:CudaSelectiveRecompute.*:CudaOps.Attention*:CudaPack*'
grep -E "PASSED|FAILED|SKIPPED|Failure|error" $L/t_rest.log | head -12; pack
# h2's packed rows against unpacked ones with the same tiles (only if its tests passed)
if grep -q "PASSED" $L/t_attn.log && ! grep -q "FAILED" $L/t_attn.log; then
  for hd in 128 64; do for a in "8 2048 32 8 $hd --pack 512" "32 512 32 8 $hd" "8 2048 32 8 $hd --pack 512" "32 512 32 8 $hd"; do
    timeout 20 gpubin/attn_bench $a 2>&1 | grep RESULT | tee -a $L/attn_packed.txt | cut -c1-160; done; done
fi
pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 3 --warmup 1"
s torch_olmoe 100 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm
tail -1 $L/torch_olmoe.log | cut -c1-400
# OLMoE at 24 GiB: upload copies (the planner's choice), then with the first 3 host layers' updates
# held for the next forward (SF_HOLD_GRADS elements: ~ the forward's time of host AdamW work)
for c in "auto 0" "auto_hold 1000000000" "off 0"; do
  set -- $c
  [ $(el) -gt 400 ] && break
  t0=$(date +%s); SF_HOLD_GRADS=$2 timeout 90 $B bench --preset olmoe-1b-7b $O --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16 --upload-copies ${1%_hold} > $L/olmoe_$1.json 2> $L/olmoe_$1.log; echo "olmoe_$1 rc=$? $(( $(date +%s)-t0 ))s"; sumj $L/olmoe_$1.json
  pack
  [ $1 = auto_hold ] && [ $(el) -gt 330 ] && break
done
for c in "clip0_on 0 on 0" "clip0_on_hold 0 on 800000000" "clip0_off 0 off 0" "clip1_auto 1 auto 0"; do
  set -- $c
  [ $(el) -gt 500 ] && break
  t0=$(date +%s); SF_HOLD_GRADS=$4 timeout 60 $B bench --preset llama-3b $O --offload --gpu-blobs 0 --max-grad-norm $2 --upload-copies $3 > $L/host3b_$1.json 2> $L/host3b_$1.log; echo "host3b_$1 rc=$? $(( $(date +%s)-t0 ))s"; sumj $L/host3b_$1.json
done
pack
echo total $(el)s
