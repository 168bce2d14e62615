#!/usr/bin/env bash
# Reproduces podman 4.3's engine deadlock (docs/runtimes.md#the-container-engine) with the
# docker CLI alone, and shows the way metrale creates containers avoids it.
#
#   bash benchmarks/engine_deadlock.sh docker 120 8 [IMAGE]         # created as `docker run`
#   bash benchmarks/engine_deadlock.sh podman-remote 120 8 [IMAGE]  # as metrale creates them
#
# WORKERS loops run for SECONDS, each cycle: create and start a container, two execs, a `cp`
# (of a payload that is no tar: the engine mounts the container, then refuses it), `rm -f`.
# Any call that takes over 60 s means the engine is wedged: the script says WEDGED and exits 1;
# recover with `bash scripts/container-engine.sh down`, `pkill -9 -f 'container cleanup'`,
# `bash scripts/container-engine.sh up`, `metrale cleanup --runtime docker`.
# Needs the engine's exports: eval "$(bash scripts/container-engine.sh up)".
set -u
MODE=${1:?docker or podman-remote} SECONDS_=${2:-120} WORKERS=${3:-8}
IMAGE=${4:-metrale/base:bookworm}
case "$MODE" in
docker) CREATE=(docker run) ;;
podman-remote) CREATE=(podman --remote --url "${DOCKER_HOST:?run the engine exports first}" run --userns=auto:size=65536) ;;
*) echo "engine_deadlock.sh: MODE must be docker or podman-remote, not '$MODE'" >&2; exit 2 ;;
esac
FLAG=$(mktemp -u /tmp/metrale-deadlock.XXXXXX)
trap 'rm -f "$FLAG" "$FLAG".*' EXIT
END=$(($(date +%s) + SECONDS_))
call() {
    [ -e "$FLAG" ] && return 0
    timeout -k 5 60 "$@" >/dev/null 2>&1
    [ $? -eq 124 ] && { echo "a call hung for 60 s: ${*:1:3}"; touch "$FLAG"; }
    return 0
}
worker() {
    local n=0 name
    while [ "$(date +%s)" -lt "$END" ] && [ ! -e "$FLAG" ]; do
        name="metrale-deadlock-$$-$1-$n"
        call "${CREATE[@]}" -d --init --pull never --name "$name" --label metrale.sandbox=1 \
            --network none --entrypoint sh "$IMAGE" -c 'exec sleep infinity'
        call docker exec "$name" true
        call docker exec "$name" sh -c 'echo hi > /tmp/x'
        echo data | call docker cp - "$name:/tmp/"
        call docker rm -f "$name"
        n=$((n + 1))
    done
    echo "$n" >"$FLAG.$1"
}
began=$(date +%s)
for w in $(seq 1 "$WORKERS"); do worker "$w" & done
wait
cycles=$(cat "$FLAG".* 2>/dev/null | awk '{s += $1} END {print s + 0}')
rm -f "$FLAG".*
if [ -e "$FLAG" ]; then
    echo "WEDGED after $(($(date +%s) - began)) s ($MODE, $WORKERS workers, $IMAGE)"
    exit 1
fi
echo "OK: $cycles cycles in $(($(date +%s) - began)) s ($MODE, $WORKERS workers, $IMAGE)"
