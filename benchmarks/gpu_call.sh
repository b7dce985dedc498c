#!/bin/bash
# One device call for what issue 27 still asks of a GPU:
# - `make gpu-check` in full: its tests, among them that no Triton path waits for the device; the
#   attention table; HF training and decoding, with where a training step goes for both models; the
#   RNN, with the Adam/RMSProp LSTM's one-launch recurrence beside the default; its section opens with
#   issue 27's goals judged from its rows (benchmarks/goals.py), printed here too;
# - each kernel's device time beside the host's issue time and the back-to-back step, and where the
#   host's time goes (benchmarks/gpu_kernels.py: cProfile of the calling thread, and torch.profiler's
#   self times on every thread by kind, benchmarks/host_trace.py), for the default kernels and the
#   fused ones, whose chunk loop is now software-pipelined in bf16 (session 24; one pass against
#   split scans was measured in session 16);
# - an eager decode step of momentum_transformer and of Llama (bf16, batch 1, context 512): its time,
#   and the host's self time by kind on every thread (benchmarks/decode_step.py --host-trace);
# - exact fp32's kernels as the autotuner picks them by default (six bf16 products in the per-chunk
#   kernels, FMA dots in the scans), then with the per-chunk kernels forced to the whole-head tiles,
#   and with FMA dots in every kernel (MOMENTUM_TRITON_FP32_DOTS=ieee, the default until session 56);
# - the host's time by kind, as for the decode step, for a forward+backward of MomentumLSTM and of
#   nn.LSTM called a layer at a time, at PTB (benchmarks/rnn.py --host-trace); then MomentumLSTM's
#   time with its filtered input unpadded (the default) and padded to a multiple of 8 channels
#   (session 56), beside both nn.LSTM calls;
# - an HF training step of both models at T = 8192, eager and compiled with CUDA graphs (the eager
#   momentum step was host-bound on the H200: docs/benchmarks.md, 2026-11-28);
# - gpu-check's tests not started in its tests part (13 on 2026-11-28), in what is left of the
#   command's 10 minutes (gpu_check.py resumes them alone; their section goes to check-tests.md).
# Its host columns are where session 17's launch plans (docs/benchmarks.md, 2026-11-29: a quarter to
# two fifths less host time per call on the CPU machine) show, or do not, on a GPU; gpu-check's RNN
# table is where session 18's LSTM loop without per-step views (a third less host time on the CPU
# machine) does. About 9.5 minutes from a bare machine (gpu-check's 353 s on 2026-11-28, then about
# 220 s, and the not-started tests in what is left of 570 s). Before the call, here: the wheels in
# .whl (docs/developing.md, "Benchmarks and the GPU suite") and, where no earlier call's cache is in
# .triton-carry, `make triton-carry`; the call: `bash benchmarks/gpu_call.sh` with carry [".whl",
# ".triton-carry"] and timeout_s 600.
# Triton's cache: the kernels an earlier call compiled come back from it as $OUT/triton-cache.tar.xz.N
# with its KEY (benchmarks/triton_cache.py; put them in .triton-carry here, in place of what was
# there; a cache over three parts of 15 MiB comes back without either), or `make triton-carry` builds
# them on the CPU machine for this image's Triton (benchmarks/triton_cache_prebuild.py, with a KEY
# file that the call compares with its Triton's key); they are unpacked before anything runs, so that
# a kernel whose key has not changed loads instead of compiling; the call says how many it compiled
# all the same, and which specialisations its processes used that the build's log (specs.jsonl.gz
# beside the parts) lacks, with the field that differs (benchmarks/triton_specs.py); its own log
# comes back as $OUT/specs.jsonl.gz, to copy into .triton-carry with the parts and KEY. Its logs and
# outputs come back as one archive: $OUT returns at most 8 files.
export PYTHONUNBUFFERED=1
R=$PWD
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/momentum-triton-cache}
CARRIED=${CARRIED:-.triton-carry}
if compgen -G "$CARRIED/*.[0-9]" > /dev/null; then
  python3 benchmarks/triton_cache.py unpack $CARRIED $TRITON_CACHE_DIR
fi
python3 benchmarks/triton_cache.py key --expect $CARRIED/KEY
touch $TRITON_CACHE_DIR.stamp
# every Python process records the Triton specialisations it needs (benchmarks/triton_specs.py), to
# name at the end those the carried build lacks (516 kernels compiled here on 2026-12-04, cause unknown)
export MOMENTUM_TRITON_SPECS_LOG=${MOMENTUM_TRITON_SPECS_LOG:-$R/outputs/triton-specs.jsonl}
mkdir -p $(dirname $MOMENTUM_TRITON_SPECS_LOG) && : > $MOMENTUM_TRITON_SPECS_LOG       # this call's only
SITE=$R/benchmarks/triton_specs_site
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
END=585                # seconds of the call's 600 that its steps may take (the archive after them)
within() {             # within MAX CMD...: CMD under a timeout of MAX or what is left before END
  local left=$((END - SECONDS)) max=$1
  shift
  if [ $left -lt 20 ]; then echo "not run, ${left} s left: ${*:1:4} …"; return 0; fi
  timeout $((left < max ? left : max)) "$@"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
echo "== gpu-check"
timeout 500 python3 benchmarks/gpu_check.py --force --limit 390 --out-dir outputs/gpu-check --doc $OUT/check.md \
  2>&1 | tail -6
grep -E "passed|FAILED" $OUT/check.md | head -20
sed -n "/^### Issue 27's goals/,/^### Tests/p" $OUT/check.md | grep "^| " | cut -c1-220   # the verdicts
compiled() { python3 benchmarks/triton_cache.py compiled $TRITON_CACHE_DIR --since $TRITON_CACHE_DIR.stamp; }
echo "after gpu-check: $(compiled)"
grep -E "^\| (bf16|fp32|[0-9]+ \|)" $OUT/check.md | cut -d'|' -f2-8 | head -30
grep -E "^\| (ptb|pmnist)" $OUT/check.md | cut -d"|" -f2-5,8-9 | head -40     # the RNN rows, with device busy
echo "== kernels"
within 70 env PYTHONPATH=$SITE:$R python3 benchmarks/gpu_kernels.py --modes default fused --host-profile 25 \
  --host-trace --json $OUT/kernels.json > $OUT/kernels.log 2>&1
grep -E "^B-H-D-T|Error" $OUT/kernels.log
grep -A14 "^host trace, B-H-D-T 4-16-64-4096" $OUT/kernels.log | grep -E "^Host|^\| [A-Za-z]" | cut -c1-160
# eager decoding at batch 1 waits on the host (docs/benchmarks.md, 2026-12-04): where the host's time goes
# in a step of each model, on every thread, by kind (benchmarks/host_trace.py), bf16 weights, gpu-check's size
echo "== an eager decode step's host time by kind: momentum, then Llama at context 512"
within 45 env PYTHONPATH=$SITE:$R python3 benchmarks/decode_step.py --layers 4 --hidden 512 --heads 8 --ffn 2048 \
  --vocab 32000 --batches 1 --contexts 512 --kinds eager --dtype bf16 --rounds 5 --per_round 5 --host-trace \
  > $OUT/decode_host.log 2>&1
grep -E "^\| (momentum|llama) |^Host|^\| [A-Za-z-]+ .*\| [0-9]+ \| [0-9]+%|Error" $OUT/decode_host.log | cut -c1-160
# exact fp32 (5.44× bf16 on 2026-12-04, the goal 3×): by default now six bf16 tensor-core products in
# the per-chunk kernels and FMA dots in the scans ("auto"; per kernel on 2026-12-04, the per-chunk
# kernels took 1134/616/676 µs with bf16x6 against 2524/1042/1026 with FMA, the scans 1065/946
# against 645/407), the autotuner choosing among the kept tiles; then the per-chunk kernels forced to
# the tiles that compute each chunk's intra-chunk product once, which the pruner keeps for FMA dots
# only (bf16x6's tensor-core dots have not run at them on a GPU); then FMA dots in every kernel, the
# default before (4360 µs forced to the whole-head tiles, 5870 at the kept ones); gpu-check's tests
# part has both's exactness, and test_every_kept_tile_config runs every tile the pruner keeps
echo "== fp32 B16-H16-T1k, default dots (bf16x6 in fwd_o, bwd_dv, bwd_dqk; FMA in the scans), then whole-head tiles"
within 60 env PYTHONPATH=$SITE:$R python3 benchmarks/gpu_kernels.py --dtype fp32 --shapes 0 --modes default \
  --tiles fwd_o=16,64,8 bwd_dv=16,64,8 bwd_dqk=64,16,8 --json $OUT/fp32_tiles.json > $OUT/fp32_tiles.log 2>&1
grep -E "^B-H-D-T|fwd_o|bwd_dv|bwd_dqk|fwd_h|bwd_dh|Error" $OUT/fp32_tiles.log | head -28
echo "== fp32 B16-H16-T1k with FMA dots in every kernel (MOMENTUM_TRITON_FP32_DOTS=ieee)"
within 60 env MOMENTUM_TRITON_FP32_DOTS=ieee PYTHONPATH=$SITE:$R python3 benchmarks/gpu_kernels.py --dtype fp32 \
  --shapes 0 --modes default --json $OUT/fp32_ieee.json > $OUT/fp32_ieee.log 2>&1
grep -E "^B-H-D-T|fwd_o|bwd_dv|bwd_dqk|fwd_h|bwd_dh|Error" $OUT/fp32_ieee.log | head -14
# MomentumLSTM at PTB: 1.45x nn.LSTM with the device busy 75 % of the time, where nn.LSTM called a
# layer at a time took 1.20x at 86 % (2026-12-04): where each one's host time goes, on every thread
# (after the fp32 steps, which time session 56's default against the one before it, and before the
# rest: the call's later steps are the ones its 10 minutes may not reach)
echo "== the momentum LSTM's host time by kind against nn.LSTM a layer at a time, PTB 3 x 1150"
within 30 env PYTHONPATH=$SITE:$R python3 benchmarks/rnn.py --device cuda --shapes ptb-3x1150 --host-trace \
  --variants nn.LSTM-per-layer momentum > $OUT/lstm_host.log 2>&1
grep -E "^Host|^\| [A-Za-z-]+ .*\| [0-9]+ \| [0-9]+%|Error" $OUT/lstm_host.log | cut -c1-160
# MomentumLSTM's filtered input padded to a multiple of 8 channels (session 56, opt-in: 401 and 1151 at
# PTB give the input GEMMs an odd row pitch) against the default, unpadded, beside both nn.LSTM calls
echo "== MomentumLSTM at PTB 3 x 1150: input channels unpadded (default) and padded to 8"
within 30 env PYTHONPATH=$SITE:$R python3 benchmarks/rnn.py --device cuda --shapes ptb-3x1150 \
  --variants nn.LSTM nn.LSTM-per-layer momentum momentum-padded --repeats 8 > $OUT/lstm_padding.log 2>&1
grep -E "^\| ptb|Error" $OUT/lstm_padding.log | cut -d'|' -f2-5
# the Adam LSTM's recurrence at 256, 512 and 768 units (T 100, B 64): where one launch per step, which
# "auto" takes up to 256 units (0.40x the two-launch loop at pMNIST, 1.58x at PTB on 2026-12-04), stops
# paying
echo "== the Adam LSTM: one launch per step against a GEMM and a kernel, by hidden size"
within 45 env PYTHONPATH=$SITE:$R python3 benchmarks/rnn.py --device cuda --shapes b64-h256 b64-h512 b64-h768 \
  --variants nn.LSTM adam-triton adam-triton-one-launch --repeats 8 > $OUT/lstm_crossover.log 2>&1
grep -E "^\| b64|Error" $OUT/lstm_crossover.log | cut -d'|' -f2-5
echo "== an HF training step at T = 8192, eager and compiled with CUDA graphs"
within 90 env PYTHONPATH=$SITE:/tmp/gpu-check-site:$R python3 benchmarks/train_host_profile.py --length 8192 \
  --skip-profile --compile reduce-overhead > $OUT/train.log 2>&1
grep -E "^==|Error" $OUT/train.log
LEFT=$((570 - SECONDS))        # the ceilings again (15 s); the tests end by 570 s, before the archives
if [ $LEFT -ge 100 ]; then
  echo "== the gpu tests not started above, in ${LEFT} s"
  timeout $LEFT python3 benchmarks/gpu_check.py --parts tests --budgets tests=$((LEFT - 20)) --limit $LEFT \
    --out-dir outputs/gpu-check --doc $OUT/check-tests.md 2>&1 | tail -3
  grep -E "passed|FAILED" $OUT/check-tests.md | head -20
fi
echo "at the end: $(compiled)"
echo "== the specialisations used here that the carried build's log lacks"
python3 benchmarks/triton_specs.py diff $MOMENTUM_TRITON_SPECS_LOG $CARRIED/specs.jsonl.gz --limit 30
[ -s $MOMENTUM_TRITON_SPECS_LOG ] && gzip -c $MOMENTUM_TRITON_SPECS_LOG > $OUT/specs.jsonl.gz
python3 benchmarks/triton_cache.py pack $TRITON_CACHE_DIR $OUT/triton-cache.tar.xz --part-mib 15 --max-parts 3 \
  && python3 benchmarks/triton_cache.py key --write $OUT/KEY --cache-dir $TRITON_CACHE_DIR
(cd $OUT && tar czf results.tgz *.log *.json -C $R outputs/gpu-check 2>/dev/null; [ -s results.tgz ] && rm -f *.log *.json)
ls $OUT
echo done
