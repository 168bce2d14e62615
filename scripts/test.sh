#!/usr/bin/env bash
# Everything the tests need on a fresh Debian/Ubuntu machine, then ruff, ruff format and mypy,
# then the tests, then the check that no test CI is meant to run was skipped. Idempotent: a
# second run installs nothing new.
#   bash scripts/test.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."

# bubblewrap: the bwrap runtime; psmisc: fuser (the agentic task's teardown); curl: agent checks;
# chromium: renders `metrale report --html` headless (tests/matrix/test_html.py); cmake, make
# and g++: the embedded llama-server's build (scripts/llama-server.sh).
missing=()
for tool in bwrap:bubblewrap fuser:psmisc curl:curl chromium:chromium cmake:cmake make:make \
    g++:g++; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# cargo: the agentic_webserver tests (their warm step fetches ~60 crates from crates.io once and
# caches the build in ~/.cache/metrale/cargo). rustup's default place, when it is not on PATH.
export PATH="$PATH:$HOME/.cargo/bin"
command -v cargo >/dev/null || echo "warning: no cargo: the agentic_webserver tests will skip" >&2

[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[dev,local]'
# The embedded default target (README command 1): ~10 minutes the first time on 2 cores,
# cached by version and flags after that (the script prints where).
bash scripts/llama-server.sh >/dev/null

# Lint, format and types before anything slow: the first check that fails ends the script
# with one line naming it (its own output is above that line).
check() {
    local name=$1
    shift
    "$@" || { echo "scripts/test.sh: $name failed: $*" >&2; exit 1; }
}
check "ruff check" python -m ruff check src tests
check "ruff format" python -m ruff format --check src tests
check "mypy (see [tool.mypy] in pyproject.toml)" python -m mypy

# The container engine for the docker runtime's tests (podman + runc, the base image built from
# Debian's packages: ~3 min the first time, seconds once built). An engine this script started
# is stopped again when it ends (the image stays); one that was up before is left up.
if ! bash scripts/container-engine.sh status >/dev/null 2>&1; then
    trap 'bash scripts/container-engine.sh down >/dev/null 2>&1 || true' EXIT
fi
eval "$(bash scripts/container-engine.sh up)"

python -m pytest "$@"
# Every test meant to run here ran: any skip not in tests/skips_allowed.toml fails.
python scripts/check_skips.py
