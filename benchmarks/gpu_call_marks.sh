#!/bin/bash
# The device call after benchmarks/gpu_call.sh found, on an H200 (2026-11-28), a decoder layer's causal
# NaN marks taking 1.0 ms at B1-H16-T16384 (one program per row, scanning it) and the native model's
# training step host-bound (33.4 ms a step, 20.7 ms of device work). In order of worth: the marks
# kernel that reads each tile alone, in a decoder layer's call against the same in PyTorch ops; the
# gpu tests of the feature marks and of the waits in HF steps (fixed since); where the host's time
# goes in a training step of both models at T = 8192, and the same steps compiled with CUDA graphs
# (benchmarks/train_host_profile.py); last, each kernel's device time in fp32 (4.2x bf16's wall there).
# About 6 minutes from a bare machine; carry [".whl"] (docs/developing.md), timeout_s 340.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "== a decoder layer's call: NaN marks in Triton, then in PyTorch ops"
timeout 50 python3 benchmarks/gpu_kernels.py --modes layer layer-torch-marks --shapes 0 2 \
  --json $OUT/layer.json > $OUT/layer.log 2>&1
grep -E "^B-H-D-T|Error|mark_causal|finite_features" $OUT/layer.log
echo "== gpu tests: feature marks, waits in HF steps"
timeout 70 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --timeout 60 \
  tests/test_attention_triton_feature_marks.py tests/test_hf_gpu_syncs.py > $OUT/tests.log 2>&1
grep -E "passed|failed|Error|assert" $OUT/tests.log | tail -8
echo "== the host in a training step, eager"
timeout 60 python3 benchmarks/train_host_profile.py --length 8192 > $OUT/train_host.log 2>&1
grep -E "^==|Error" $OUT/train_host.log
echo "== compiled with CUDA graphs"
timeout 100 python3 benchmarks/train_host_profile.py --length 8192 --skip-profile --compile reduce-overhead \
  > $OUT/train_compiled.log 2>&1
grep -E "^==|Error" $OUT/train_compiled.log
echo "== fp32 kernels"
timeout 40 python3 benchmarks/gpu_kernels.py --modes default --shapes 0 --dtype fp32 > $OUT/fp32.log 2>&1
grep -vE "^\s*$|Warn|warn" $OUT/fp32.log | head -16
echo done
