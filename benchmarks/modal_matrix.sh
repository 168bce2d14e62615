#!/usr/bin/env bash
# The seed's gsm8k matrix shape for the modal runtime, against local stand-ins:
#   metrale matrix gsm8k --runtime modal --rollouts 64,512,1024
# with `metrale sim` as the endpoint and `metrale sandbox-sim modal` (bwrap sandboxes behind
# it) as the sandbox service, its creation latency drawn as the seed measured modal's setup at
# 64 rollouts: p50 8.0 s, p90 12.5 s. Writes the cells, the report (stdout and report.md) and
# the plot into OUT, and prints the emulator's state after the sweep (no live sandbox).
#
# usage: bash benchmarks/modal_matrix.sh [OUT] [ROLLOUTS] [LATENCY]
#   e.g. bash benchmarks/modal_matrix.sh results/modal 64,512,1024 8.0,12.5
set -euo pipefail
out=${1:-results/modal-matrix}
rollouts=${2:-64,512,1024}
latency=${3:-8.0,12.5}
python=${PYTHON:-python}
logs=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$logs"
}
trap cleanup EXIT

wait_line() {  # FILE PATTERN: wait until the file holds the pattern (a server is up)
  for _ in $(seq 300); do grep -q "$2" "$1" && return 0; sleep 0.2; done
  echo "server did not start: $(cat "$1")" >&2; return 1
}

"$python" -m metrale sim --port 0 > "$logs/sim" 2>&1 & pids+=($!)
"$python" -m metrale sandbox-sim modal --port 0 --create-latency "$latency" --seed 1 \
  > "$logs/modal" 2>&1 & pids+=($!)
wait_line "$logs/sim" "listening on"
wait_line "$logs/modal" "METRALE_SANDBOX_SIM_STATE="
target=$(awk '/listening on/ {print $NF}' "$logs/sim")
config=$(mktemp)  # an empty SDK config: no profile of the user's is read
set -a; eval "$(grep -E '^(MODAL_|METRALE_SANDBOX_SIM_STATE)' "$logs/modal")"; set +a
export MODAL_CONFIG_PATH=$config

"$python" -m metrale matrix gsm8k --target "$target" --runtime modal \
  --rollouts "$rollouts" --out "$out"
"$python" -m metrale report "$out" | tee "$out/report.md"
"$python" -m metrale plot "$out" -o "$out/plot.png" || echo "no plot (the plot extra: pip install 'metrale[plot]')"
echo "emulator after the sweep: $(curl -s "$METRALE_SANDBOX_SIM_STATE")"
rm -f "$config"
