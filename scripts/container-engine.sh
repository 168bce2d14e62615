#!/usr/bin/env bash
# A container engine for metrale's docker runtime on a machine with no registry and no systemd:
# podman (Debian's package) with runc, a base image built from Debian's packages only, and a
# Docker-API socket (`podman system service`) that the docker CLI talks to.
#
#   eval "$(bash scripts/container-engine.sh up)"   # install, build once, start; print exports
#   bash scripts/container-engine.sh status         # what is up (exit 0 only when all is)
#   bash scripts/container-engine.sh down           # stop the service by its pid; keep the image
#
# All engine state (storage, configs, socket, pid file, logs) lives under $METRALE_ENGINE_DIR
# (default ~/.cache/metrale/engine); the system's /etc/containers is never modified: podman
# reads our configs through CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, which `up` prints.
# Root inside a container is not root outside: every container gets its own user namespace
# (`userns = "auto"`) carved from the subordinate range of the `containers` entry in
# /etc/subuid and /etc/subgid; metrale's image builder runs as root of a namespace of root's
# entry (src/metrale/benchmarks/terminal_bench/builder.py). `up` adds both entries if absent.
# stdout carries only eval-able lines; progress and errors go to stderr.
set -euo pipefail

DIR="${METRALE_ENGINE_DIR:-$HOME/.cache/metrale/engine}"
IMAGE="metrale/base:bookworm"
SUITE="bookworm"
PACKAGES="git,python3,curl,ca-certificates,procps,psmisc,bash"
CONF="$DIR/containers.conf"
STORAGE_CONF="$DIR/storage.conf"
SOCK="$DIR/podman.sock"
PIDFILE="$DIR/service.pid"
# host uids of containers' user namespaces, and of the image builder's (builder.py's
# BUILD_UID_BASE): above every account, disjoint from each other and from bwrap's 1.8e9..1.9e9
CONTAINERS_SUBID="containers:1700000000:100000000"
BUILDER_SUBID="root:1690000000:65536"
LOG="$DIR/service.log"

say() { echo "container-engine: $*" >&2; }
die() {
    say "$*"
    exit 2
}

usage() {
    echo "usage: bash scripts/container-engine.sh up|down|status" >&2
    exit 2
}

engine_env() {
    export CONTAINERS_CONF="$CONF" CONTAINERS_STORAGE_CONF="$STORAGE_CONF"
}

print_exports() {
    printf 'export METRALE_ENGINE_DIR=%q\n' "$DIR"
    printf 'export CONTAINERS_CONF=%q\n' "$CONF"
    printf 'export CONTAINERS_STORAGE_CONF=%q\n' "$STORAGE_CONF"
    printf 'export DOCKER_HOST=%q\n' "unix://$SOCK"
}

install_packages() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    [ -x /usr/bin/catatonit ] || missing+=(catatonit)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v newuidmap >/dev/null || missing+=(uidmap)
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: run as root to install them with apt-get"
    say "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    mkdir -p "$DIR"
    if ! apt-get install -y -qq "${missing[@]}" >"$DIR/apt.log" 2>&1; then
        apt-get update -qq >>"$DIR/apt.log" 2>&1
        apt-get install -y -qq "${missing[@]}" >>"$DIR/apt.log" 2>&1 ||
            die "apt-get could not install ${missing[*]}; see $DIR/apt.log"
    fi
}

subids() {
    # idempotent: an entry is added once, never changed; other entries are left alone
    local file entry
    for file in /etc/subuid /etc/subgid; do
        for entry in "$CONTAINERS_SUBID" "$BUILDER_SUBID"; do
            grep -qxF "$entry" "$file" 2>/dev/null && continue
            if [ "$(id -u)" -ne 0 ]; then
                say "$file lacks '$entry' (not root: left as is; see docs/security.md)"
                continue
            fi
            echo "$entry" >>"$file"
            say "added $entry to $file"
        done
    done
}

write_configs() {
    mkdir -p "$DIR/storage/graph" "$DIR/storage/run" "$DIR/tmp" "$DIR/networks"
    # runc fails with EPERM when a container's ulimits exceed this process's hard limits (root
    # here lacks CAP_SYS_RESOURCE), and podman's default is 1048576: use the hard limits.
    local nofile nproc
    nofile="$(ulimit -Hn)"
    nproc="$(ulimit -Hu)"
    [ "$nofile" = unlimited ] && nofile=1048576
    if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
    local tmp
    tmp="$(mktemp "$DIR/.conf.XXXXXX")"
    cat >"$tmp" <<EOF
# written by metrale scripts/container-engine.sh; read through CONTAINERS_CONF
[containers]
# each container its own user namespace from the 'containers' range of /etc/subuid: root
# inside is an unprivileged uid outside. metrale's docker runtime creates its containers with
# podman's client and --userns=auto:size=65536 instead: through the Docker API podman 4.3 sizes
# the namespace from the image, which can deadlock the engine (docs/runtimes.md).
userns = "auto"
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
init_path = "/usr/bin/catatonit"
log_driver = "k8s-file"

[network]
network_config_dir = "$DIR/networks"

[engine]
# crun refuses this host's hybrid cgroup layout; runc works. No systemd: cgroupfs, file events.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$DIR/events.log"
tmp_dir = "$DIR/tmp"
# podman keeps each exec session's conmon this long so an API client can read its exit code
# (0 loses the docker CLI's exit codes); the default 300 piles up two conmons per exec.
exit_command_delay = 5
EOF
    # a running service read the old one: `up` restarts it when this changed
    if [ -f "$CONF" ] && cmp -s "$tmp" "$CONF"; then CONF_CHANGED=0; else CONF_CHANGED=1; fi
    mv -f "$tmp" "$CONF"
    tmp="$(mktemp "$DIR/.conf.XXXXXX")"
    cat >"$tmp" <<EOF
# written by metrale scripts/container-engine.sh; read through CONTAINERS_STORAGE_CONF
[storage]
driver = "overlay"
graphroot = "$DIR/storage/graph"
runroot = "$DIR/storage/run"
EOF
    mv -f "$tmp" "$STORAGE_CONF"
}

debian_mirror() {
    # the mirror apt already uses (deb822 or one-line sources), so the build needs no other host
    if [ -n "${METRALE_DEBIAN_MIRROR:-}" ]; then
        echo "$METRALE_DEBIAN_MIRROR"
        return
    fi
    local uri
    uri="$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '{print $2}' | grep -v security | head -n1 || true)"
    [ -z "$uri" ] && uri="$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null |
        awk '{print $2}' | grep -v security | head -n1 || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}

image_present() { podman image exists "$IMAGE" 2>/dev/null; }

build_image() {
    if image_present; then
        tag_image
        return 0
    fi
    local mirror rootfs
    mirror="$(debian_mirror)"
    rootfs="$DIR/rootfs.build"
    rm -rf "$rootfs"
    say "building $IMAGE: debootstrap --variant=minbase $SUITE from $mirror (a few minutes)"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" \
        >"$DIR/debootstrap.log" 2>&1 ||
        die "debootstrap failed; see $DIR/debootstrap.log"
    # apt caches and lists are not part of the image (rebuilt from Debian's packages anyway)
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null 2>>"$DIR/debootstrap.log" ||
        die "podman import of $rootfs failed"
    rm -rf "$rootfs"
    tag_image
    say "built $IMAGE"
}

tag_image() {
    # Docker-API clients name images with docker.io semantics, and a task Dockerfile's
    # `FROM debian:bookworm` must resolve locally (no registry): tag every spelling.
    local name
    for name in "docker.io/$IMAGE" "docker.io/library/debian:$SUITE" "localhost/debian:$SUITE"; do
        podman image exists "$name" 2>/dev/null || podman tag "$IMAGE" "$name"
    done
}

service_pid() {
    # the pid in our pid file, if that process is alive and is our podman service
    [ -f "$PIDFILE" ] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "system service.*unix://$SOCK" || return 1
    echo "$pid"
}

socket_answers() {
    curl -sf --max-time 5 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1
}

close_inherited_fds() {
    local fd n
    for fd in /proc/"$BASHPID"/fd/*; do
        n="${fd##*/}"
        [ "$n" -gt 2 ] 2>/dev/null && eval "exec $n>&-" 2>/dev/null
    done
    return 0
}

start_service() {
    if service_pid >/dev/null && socket_answers; then
        return 0
    fi
    stop_service quiet
    rm -f "$SOCK"
    say "starting the Docker-API socket unix://$SOCK"
    # setsid + nohup: the service outlives this script and the shell that eval'd it. Started in
    # $DIR: conmon inherits the service's working directory and writes files there (an `oom`
    # marker when a container's memory limit kills a process), never in the caller's tree.
    # No descriptor but 0-2 goes with it: run under `flock LOCK cmd`, the service inherited
    # the lock's descriptor and held the shared engine lock for as long as it lived.
    (
        close_inherited_fds
        exec setsid nohup env -C "$DIR" podman system service --time=0 "unix://$SOCK" \
            >>"$LOG" 2>&1 </dev/null
    ) &
    echo $! >"$PIDFILE"
    local i
    for i in $(seq 1 100); do
        socket_answers && return 0
        service_pid >/dev/null || die "podman system service exited; see $LOG"
        sleep 0.2
    done
    stop_service quiet
    die "podman system service did not answer on $SOCK within 20 s; see $LOG"
}

stop_service() {
    local pid i
    if pid="$(service_pid)"; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
        [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null || true
        [ "${1:-}" = quiet ] || say "stopped the service (pid $pid)"
    elif [ "${1:-}" != quiet ]; then
        say "service not running"
    fi
    rm -f "$PIDFILE" "$SOCK"
}

cmd_up() {
    install_packages
    subids
    mkdir -p "$DIR"
    CONF_CHANGED=0
    write_configs
    if [ "$CONF_CHANGED" -eq 1 ] && service_pid >/dev/null; then
        say "configuration changed: restarting the service"
        stop_service quiet
    fi
    engine_env
    # runc, not crun: checked here so a podman without runc fails now, not at the first run
    command -v runc >/dev/null || die "runc is missing (apt-get install runc)"
    build_image
    start_service
    say "up: $IMAGE, DOCKER_HOST=unix://$SOCK"
    print_exports
}

cmd_status() {
    local ok=0 pid
    if command -v podman >/dev/null; then
        echo "# podman: $(podman --version 2>/dev/null) ($(command -v podman))"
    else
        echo "# podman: not installed"
        ok=1
    fi
    if [ ! -f "$CONF" ] || [ ! -f "$STORAGE_CONF" ]; then
        echo "# engine dir $DIR: not set up"
        ok=1
    else
        engine_env
        if [ $ok -eq 0 ] && image_present; then
            echo "# image $IMAGE: present"
        else
            echo "# image $IMAGE: absent"
            ok=1
        fi
    fi
    if pid="$(service_pid)" && socket_answers; then
        echo "# service: running (pid $pid), socket unix://$SOCK"
    else
        echo "# service: not running"
        ok=1
    fi
    if [ $ok -eq 0 ]; then
        print_exports
    else
        echo "# bring it up with: bash scripts/container-engine.sh up"
    fi
    return $ok
}

[ $# -eq 1 ] || usage
case "$1" in
up) cmd_up ;;
down)
    stop_service
    ;;
status) cmd_status ;;
*) usage ;;
esac
