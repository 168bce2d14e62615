#!/usr/bin/env bash
# The floor under any per-rollout bwrap sandbox on this machine: N bare `bwrap ... true` started
# at once (no Python, no cgroup, few binds), with and without a network namespace, and with the
# 15 file binds of /etc that metrale's sandboxes used before they bound one copy of them.
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
etc=()
for f in alternatives ca-certificates ssl ld.so.cache ld.so.conf ld.so.conf.d localtime \
         nsswitch.conf hosts resolv.conf passwd group python3 mime.types protocols services \
         os-release debian_version; do
  [ -e "/etc/$f" ] && etc+=(--ro-bind "/etc/$f" "/etc/$f")
done
run "+ $(( ${#etc[@]} / 3 )) /etc file binds" --unshare-all --unshare-user "${etc[@]}"
run "+ one /etc bind" --unshare-all --unshare-user --ro-bind /etc /etc
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -r), $(bwrap --version)"
