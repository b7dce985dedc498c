#!/bin/bash
# One device call for issue 27's open question: are the fused kernels (MOMENTUM_TRITON_SCAN=fused)
# right on a GPU, and faster than the chunked ones? In order, each under its own timeout:
# gpu-check's tests part (the GPU tests run both kernel sets) and attention part (its "momentum
# triton fused" rows), each kernel's device time at the issue's four shapes in the default, one-pass
# and fused modes (benchmarks/gpu_kernels.py), and gpu-check's hf part with the fused kernels. About
# 7 minutes on an H200 from a bare machine. Before the call, here: the wheels in .whl
# (docs/developing.md, "Benchmarks and the GPU suite"); the call: `bash benchmarks/gpu_scans.sh`
# with carry [".whl"].
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
echo "== tests, attention"
timeout 400 python3 benchmarks/gpu_check.py --parts tests attention --force --out-dir outputs/scans \
  --doc $OUT/check.md 2>&1 | tail -3
grep -E "passed|FAILED" $OUT/check.md | head -20
grep -E "^\| (bf16|fp32)" $OUT/check.md | cut -d'|' -f2-8
echo "== kernels"
PYTHONPATH=$R timeout 90 python3 benchmarks/gpu_kernels.py --json $OUT/kernels.json > $OUT/kernels.log 2>&1
grep -E "^B-H-D-T|Error" $OUT/kernels.log
echo "== hf, fused kernels"
MOMENTUM_TRITON_SCAN=fused timeout 140 python3 benchmarks/gpu_check.py --parts hf --force \
  --out-dir outputs/hf-fused --doc $OUT/hf_fused.md 2>&1 | tail -3
grep -E "^\| " $OUT/hf_fused.md | head -12
tar czf $OUT/outs.tgz outputs/scans outputs/hf-fused 2>/dev/null
echo done
