#!/bin/bash
# One device call for issue 27's open question: are the fused kernels (MOMENTUM_TRITON_SCAN=fused)
# right on a GPU, and faster than the chunked ones? In order, each under its own timeout: the
# attention GPU tests (both kernel sets), gpu-check's attention part (its "momentum triton fused"
# rows), each kernel's device time at the four shapes in the default, one-pass and fused
# modes (benchmarks/gpu_kernels.py), and gpu-check's hf part with the fused kernels. About 6
# minutes on an H200 from a bare machine. Before the call, here: the wheels in .whl
# (docs/developing.md, "Benchmarks and the GPU suite"); the call: `bash benchmarks/gpu_scans.sh`
# with carry [".whl"].
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
echo "== tests"
(export PYTHONPATH=$R:$R/benchmarks GPU_CHECK_DEADLINE=$(( $(date +%s) + 120 ));
 timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -p pytest_budget -n 14 --timeout 90 \
   --junitxml=$OUT/tests.xml tests/test_attention_gpu.py > $OUT/tests.log 2>&1)
grep -E "passed|failed|FAILED|Error" $OUT/tests.log | tail -25
echo "== attention"
timeout 200 python3 benchmarks/gpu_check.py --parts attention --force --budgets attention=160 \
  --out-dir outputs/scans --doc $OUT/attention.md 2>&1 | tail -3
grep -E "^\| (bf16|fp32)" $OUT/attention.md | cut -d'|' -f2-8
echo "== kernels"
PYTHONPATH=$R timeout 90 python3 benchmarks/gpu_kernels.py --json $OUT/kernels.json > $OUT/kernels.log 2>&1
grep -E "^B-H-D-T|Error" $OUT/kernels.log
echo "== hf, fused kernels"
MOMENTUM_TRITON_SCAN=fused timeout 140 python3 benchmarks/gpu_check.py --parts hf --force \
  --out-dir outputs/hf-fused --doc $OUT/hf_fused.md 2>&1 | tail -3
grep -E "^\| " $OUT/hf_fused.md | head -12
tar czf $OUT/outs.tgz outputs/scans outputs/hf-fused 2>/dev/null
echo done
