#!/usr/bin/env bash
# Data-parallel fairseq training on CPU: torchrun starts N ranks of fairseq-train over gloo.
#
#   recipes/launch_cpu_ddp.sh N DATA --user-dir "$(python -m fairseq_momentum)" --arch ... [fairseq-train args]
#
# runs, with OMP_NUM_THREADS = cores / N (at least 1) unless it is set,
#   torchrun --standalone --nproc-per-node N fairseq-train DATA ... --cpu --distributed-world-size N
#     --distributed-init-method env:// --distributed-rank $RANK --distributed-no-spawn
#     --distributed-backend gloo --ddp-backend legacy_ddp
# (fairseq 0.12 cannot infer a CPU rank from torchrun's environment itself: it divides by the
# GPU count). Without a thread count per rank, N ranks each start one thread per core and run
# 5-30x slower. On GPUs use fairseq's standard flags instead (e.g. --distributed-world-size N).
#
# Environment:
#   FAIRSEQ_TRAIN    command that runs fairseq-train (default: fairseq-train on PATH)
#   OMP_NUM_THREADS  threads per rank (default: cores / N)
#   LOG_DIR          torchrun's --log-dir: every rank's output under
#                    LOG_DIR/<run id>/attempt_0/<rank>/ (default: only the console, rank 0)
set -euo pipefail

if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
world_size=$1
shift
read -r -a train_cmd <<< "${FAIRSEQ_TRAIN:-fairseq-train}"
threads=$(( $(nproc) / world_size ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}
logs=(--local-ranks-filter 0)
if [[ -n "${LOG_DIR:-}" ]]; then
    logs+=(--log-dir "$LOG_DIR" --redirects 3 --tee 3)
fi
echo "launch_cpu_ddp: $world_size ranks, $OMP_NUM_THREADS threads each" >&2

# each rank appends its own --distributed-rank, from the RANK torchrun gives it
exec torchrun --standalone --nproc-per-node "$world_size" "${logs[@]}" --no-python \
    bash -c 'exec "$@" --distributed-rank "$RANK"' launch_cpu_ddp \
    "${train_cmd[@]}" "$@" --cpu --distributed-world-size "$world_size" --distributed-init-method env:// \
    --distributed-no-spawn --distributed-backend gloo --ddp-backend legacy_ddp
