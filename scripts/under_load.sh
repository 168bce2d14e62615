#!/usr/bin/env bash
# The suite under load and in random order: N full runs of the tests, each with a busy loop on
# every core (`yes >/dev/null`, one per core) and pytest-randomly shuffling the order with a
# fresh seed. One line per run: seed, outcome, duration. The busy loops are stopped on every exit.
#
# Usage: bash scripts/under_load.sh [N]   (default 5; after `bash scripts/test.sh` set things up)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
python=${PYTHON:-.venv/bin/python}
had_randomly=1
"$python" -m pip show -q pytest-randomly >/dev/null 2>&1 || had_randomly=0
"$python" -m pip install -q pytest-randomly
hogs=()
had_engine=1
bash scripts/container-engine.sh status >/dev/null 2>&1 || had_engine=0
finish() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  # the venv's other runs keep their fixed order
  [ "$had_randomly" = 1 ] || "$python" -m pip uninstall -y -q pytest-randomly
  # an engine started here is stopped again (the image stays)
  [ "$had_engine" = 1 ] || bash scripts/container-engine.sh down >/dev/null 2>&1 || true
}
trap finish EXIT
for _ in $(seq "$(nproc)"); do yes >/dev/null & hogs+=($!); done
eval "$(bash scripts/container-engine.sh up | grep '^export ')"
failed=0
for i in $(seq "$runs"); do
  seed=$(( (RANDOM << 15) | RANDOM ))
  log=$(mktemp -t metrale-under-load-XXXX.log)
  start=$(date +%s)
  PATH="$PATH:$HOME/.cargo/bin" "$python" -m pytest -q -p no:cacheprovider \
    --randomly-seed="$seed" >"$log" 2>&1 && "$python" scripts/check_skips.py >>"$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  result=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$log" | tail -1 | tr -d '=')
  echo "run $i: seed $seed, exit $rc, $(echo "$result" | xargs), ${took} s (log $log)"
  [ "$rc" = 0 ] || failed=$((failed + 1))
done
echo "$runs runs under $(nproc) busy loops, random order: $failed failed"
[ "$failed" = 0 ]
