#!/bin/bash
# session 14 call 1: issue 17 close-out (8B K=1 fp32 NVMe; 3B all-host beside PyTorch), issue 19
# compute-stream busy time of the 3B step resident vs offloaded (--profile-ops)
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer
BIN=gpubin OUT=$L timeout 420 bash tools/gpu_check.sh nvme8 offload7_3b
pack; echo "gpu_check done at $(el)s"
O="--preset llama-3b --batch-size 8 --seq-len 2048 --device cuda --steps 3 --warmup 1 --profile-ops"
if [ $(el) -lt 470 ]; then
  timeout 45 $B bench $O --no-offload --keep-layers 0 --keep-attention 0 --max-grad-norm 0 > $L/prof_resident.json 2> $L/prof_resident.log; echo "prof_resident rc=$? $(el)s"; pack
fi
if [ $(el) -lt 520 ]; then
  timeout 45 $B bench $O --offload --gpu-blobs 0 --max-grad-norm 0 > $L/prof_offload.json 2> $L/prof_offload.log; echo "prof_offload rc=$? $(el)s"; pack
fi
for f in $L/prof_*.json; do python3 -c "
import json,sys
j=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
p=j.get('op_profile',{})
print(sys.argv[1].split('/')[-1], 'tok/s %.0f step_ms %.1f busy %s' % (j['tokens_per_second'], j.get('step_ms',-1), p.get('stream_busy_ms_per_step')))" $f; done
cat $L/summary.txt
echo total $(el)s
