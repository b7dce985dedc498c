#!/usr/bin/env bash
# Data-parallel fairseq training on CPU: N processes, one per rank, over gloo.
#
#   recipes/launch_cpu_ddp.sh N DATA --user-dir "$(python -m fairseq_momentum)" --arch ... [fairseq-train args]
#
# `fairseq-train --cpu --distributed-world-size N` alone trains nothing or asserts on CPU
# (fairseq 0.12); what works is one process per rank with
# --distributed-no-spawn, the gloo backend and legacy_ddp, which this script adds.
# On GPUs use fairseq's standard flags instead (e.g. --distributed-world-size N).
#
# Environment:
#   FAIRSEQ_TRAIN  command that runs fairseq-train (default: fairseq-train on PATH)
#   MASTER_PORT    rendezvous port on 127.0.0.1 (default: a free port)
#   LOG_DIR        where rank logs go (default: a new temporary directory); rank 0's log
#                  is also printed. The exit status is non-zero if any rank fails, and the
#                  remaining ranks are then stopped.
set -euo pipefail

if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
world_size=$1
shift
read -r -a train_cmd <<< "${FAIRSEQ_TRAIN:-fairseq-train}"
port=${MASTER_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
log_dir=${LOG_DIR:-$(mktemp -d -t cpu_ddp.XXXXXX)}
mkdir -p "$log_dir"
echo "launch_cpu_ddp: $world_size ranks, tcp://127.0.0.1:$port, logs in $log_dir" >&2

pids=()
stop_all() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
}
trap stop_all INT TERM

for ((rank = 0; rank < world_size; rank++)); do
    "${train_cmd[@]}" "$@" --cpu \
        --distributed-world-size "$world_size" --distributed-rank "$rank" \
        --distributed-init-method "tcp://127.0.0.1:$port" --distributed-no-spawn \
        --distributed-backend gloo --ddp-backend legacy_ddp \
        > "$log_dir/rank$rank.log" 2>&1 &
    pids+=("$!")
done

tail -n +1 -f "$log_dir/rank0.log" --pid "${pids[0]}" &
status=0
for rank in "${!pids[@]}"; do
    if ! wait "${pids[$rank]}"; then
        echo "launch_cpu_ddp: rank $rank failed, see $log_dir/rank$rank.log" >&2
        status=1
        stop_all
    fi
done
wait
exit $status
