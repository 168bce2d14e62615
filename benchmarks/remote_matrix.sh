#!/usr/bin/env bash
# The seed's matrix shape for the prime runtime, against local stand-ins of both services:
#   metrale matrix gsm8k --runtime subprocess,prime --rollouts 64,512,1024
# with `metrale sim` as the endpoint and `metrale sandbox-sim prime` (bwrap sandboxes behind
# it) as the sandbox service, its creation latency drawn as the real service's was measured:
# setup p50 10.9 s (the seed's prime figure); the seed gives no prime p90, so P90 is the p50
# times modal's p90/p50 at 64 rollouts (12.5 / 8.0), 17.0 s. Writes the cells, the report
# (stdout and report.md) and the plot into OUT.
#
# usage: bash benchmarks/remote_matrix.sh [OUT] [ROLLOUTS] [LATENCY] [RUNTIMES]
#   e.g. bash benchmarks/remote_matrix.sh results/remote 64,512,1024 10.9,17.0 subprocess,prime
set -euo pipefail
out=${1:-results/remote-matrix}
rollouts=${2:-64,512,1024}
latency=${3:-10.9,17.0}
runtimes=${4:-subprocess,prime}
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
"$python" -m metrale sandbox-sim prime --port 0 --create-latency "$latency" --seed 1 \
  > "$logs/prime" 2>&1 & pids+=($!)
wait_line "$logs/sim" "listening on"
wait_line "$logs/prime" "PRIME_API_KEY="
target=$(awk '/listening on/ {print $NF}' "$logs/sim")
set -a; eval "$(grep '^PRIME_' "$logs/prime")"; set +a

"$python" -m metrale matrix gsm8k --target "$target" --runtime "$runtimes" \
  --rollouts "$rollouts" --out "$out"
"$python" -m metrale report "$out" | tee "$out/report.md"
"$python" -m metrale plot "$out" -o "$out/plot.png" || echo "no plot (the plot extra: pip install 'metrale[plot]')"
left=$(curl -s "${PRIME_API_BASE_URL%/api/v1}/_state")
echo "emulator after the sweep: $left"
