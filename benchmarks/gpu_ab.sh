#!/bin/bash
# One device call: the GPU tests, then gpu_check's attention/hf/rnn parts on this tree and on an older
# commit's code for an A/B in one call (docs/benchmarks.md, 2026-11-27 second call). Before the call,
# here: echo /.old/ >> .git/info/exclude; git archive BASE plugins hf_momentum benchmarks | tar -x -C .old
# and the wheels in .whl (transformers as setup.cfg pins, regex); the call: run `bash benchmarks/gpu_ab.sh`
# with carry [".whl", ".old"]. The baseline compiles from scratch: 100 s was too short for its parts.
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/transformers-5.23.0-py3-none-any.whl .whl/regex-*.whl || echo "wheel install failed"
export PYTHONPATH=$R:/tmp/site
python3 -c "import transformers, triton, torch; print('transformers', transformers.__version__, 'triton', triton.__version__, 'torch', torch.__version__)"
echo "== tests"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -n 14 --timeout 90 tests/test_attention_gpu.py \
  tests/test_rnn_triton.py tests/test_rnn_device.py -k "not every_kept_tile_config or (bfloat16 and fwd_o)" 2>&1 \
  | tail -25 > $OUT/tests.log; tail -4 $OUT/tests.log
echo "== new"
timeout 190 python3 benchmarks/gpu_check.py --parts attention hf rnn --force --out-dir outputs/new \
  --doc $OUT/new.md 2>&1 | tail -6
echo "== old"
(cd .old && PYTHONPATH=$R/.old:/tmp/site timeout 100 python3 benchmarks/gpu_check.py --parts attention rnn --force \
  --out-dir outputs/old --doc $OUT/old.md 2>&1 | tail -5)
echo "== kernels"
timeout 40 python3 benchmarks/gpu_kernels.py --shapes 1 2 --forced-split --json $OUT/kernels.json > $OUT/kernels.log 2>&1
grep -E "^B-H-D-T|fwd_h|bwd_dh|merge" $OUT/kernels.log | head -40
tar czf $OUT/outs.tgz outputs/new .old/outputs/old 2>/dev/null
echo done
