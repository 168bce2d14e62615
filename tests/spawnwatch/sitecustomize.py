"""Spawn watch for the `real` marker (tests/real_parts.py), loaded by every Python process the
tests start (this directory is put first on their PYTHONPATH): when `METRALE_TEST_SPAWN_LOG`
names a file, every real part this process starts (a sandbox, a container, llama.cpp, Ray,
Chromium, cargo, the metrale command line) is appended to it as one line, so that a test not
marked `real` which starts one through `python -m metrale ...` is caught as surely as one that
starts it in-process.

Self-contained on purpose: a child's sys.path holds only this directory of the tests.
"""

from __future__ import annotations

import os
import sys

#: Programs whose start means a real part runs (the basename of argv[0]).
REAL_PROGRAMS = {
    "bwrap": "bwrap", "docker": "the container engine", "podman": "the container engine",
    "conmon": "the container engine", "chromium": "chromium", "chromium-browser": "chromium",
    "cargo": "cargo", "rustc": "cargo", "gcs_server": "Ray", "raylet": "Ray", "ray": "Ray",
    "llama-server": "llama.cpp",
}  # fmt: skip
#: Python modules whose `python -m` start means the same.
REAL_MODULES = {"llama_cpp": "llama.cpp", "ray": "Ray"}
LOG_VARIABLE = "METRALE_TEST_SPAWN_LOG"


def real_part(argv: object) -> str | None:
    """The real part a process started with `argv` is, or None (a shell, python, the sim)."""
    if isinstance(argv, str | bytes):
        argv = [argv]
    args = [os.fsdecode(a) for a in argv or () if isinstance(a, str | bytes | os.PathLike)]
    if not args:
        return None
    program = os.path.basename(args[0])
    if program in REAL_PROGRAMS:
        return REAL_PROGRAMS[program]
    if program == "metrale":  # the console script, or a shim of that name
        return None if args[1:2] == ["sim"] else "the metrale command line"
    if program.startswith("python") and "-m" in args[:-1]:
        at = args.index("-m") + 1
        module = args[at].split(".")[0]
        if module == "metrale":  # the command line end to end; the simulator is a test double
            return None if args[at + 1 : at + 2] == ["sim"] else "the metrale command line"
        return REAL_MODULES.get(module)
    return None


def real_library(name: object) -> str | None:
    """llama.cpp loaded in-process (ctypes), the other way a test runs a model."""
    text = os.fsdecode(name) if isinstance(name, str | bytes | os.PathLike) else ""
    return "llama.cpp" if "libllama" in os.path.basename(text) else None


def _log_to_file(event: str, args: tuple[object, ...]) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    found = None
    if event == "subprocess.Popen":
        found = real_part(args[1] if args[1] is not None else args[0])
    elif event == "ctypes.dlopen":
        found = real_library(args[0])
    if found is not None:
        with open(path, "a") as log:
            log.write(f"{found} (pid {os.getpid()}: {' '.join(sys.argv)[:200]})\n")


if os.environ.get(LOG_VARIABLE):
    sys.addaudithook(_log_to_file)
    # this process itself, however it was reached (a shell, a `metrale` shim that execs python)
    _me = real_part(getattr(sys, "orig_argv", sys.argv))
    if _me is not None:
        with open(os.environ[LOG_VARIABLE], "a") as _log:
            _log.write(f"{_me} (pid {os.getpid()}: {' '.join(sys.orig_argv)[:200]})\n")
