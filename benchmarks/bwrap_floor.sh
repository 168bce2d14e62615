#!/usr/bin/env bash
# The floor under any per-rollout bwrap sandbox on this machine: N bare `bwrap ... true` started
# at once (no Python, no cgroup, few binds), with and without a network namespace.
# Usage: bash benchmarks/bwrap_floor.sh [N]   (default 256)
set -euo pipefail
n=${1:-256}
binds=(--ro-bind /usr /usr --ro-bind /lib /lib --ro-bind /bin /bin --proc /proc --dev /dev --tmpfs /tmp)
[ -e /lib64 ] && binds+=(--ro-bind /lib64 /lib64)
run() {
  local label=$1; shift
  local start end
  start=$(date +%s%N)
  for _ in $(seq "$n"); do bwrap "$@" "${binds[@]}" --die-with-parent true & done
  wait
  end=$(date +%s%N)
  echo "$label: $n at once in $(( (end - start) / 1000000 )) ms, $(( (end - start) / n / 1000 )) us each"
}
run "all namespaces" --unshare-all --unshare-user
run "host network  " --unshare-all --unshare-user --share-net
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -r), $(bwrap --version)"
