"""The `real` marker: tests that start real parts (a bwrap sandbox, a container, llama.cpp, Ray,
Chromium, cargo, or the metrale command line end to end in a child process) are marked `real`,
so that `pytest -m "not real"` is the fast set a contributor runs while working
(docs/testing.md) and the full suite stays the CI gate.

The marker is applied here, at collection, so that a new test cannot forget it:

- by fixture: a test that uses a fixture in `REAL_FIXTURES` (an image's root, the cargo warm
  step, a Ray cluster);
- by path: every test of a file in `REAL_FILES` (files that are about a real part);
- by parameter: a test parametrized with a real runtime (`[bwrap]`, `[docker-...]`, `[ray-bwrap]`);
- by what it calls: a test, or a fixture it uses, whose code reaches `python -m metrale CMD`
  (other than `sim`, the test double) through functions of the test modules (`run_cli`,
  `tests.faults.helpers.cli`, a module's own helper);
- by hand, `@pytest.mark.real`, for the rest.

And a test that starts a real part without the marker fails: while such a test runs, an audit
hook in this process, and the one `tests/spawnwatch/sitecustomize.py` installs in every Python
child (`python -m metrale run --runtime bwrap ...`), record each real program started; the test's
teardown report turns them into a failure naming what was started and how to mark the test.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

_WATCH_DIR = Path(__file__).resolve().parent / "spawnwatch"
_spec = importlib.util.spec_from_file_location(
    "metrale_spawnwatch", _WATCH_DIR / "sitecustomize.py"
)
assert _spec is not None and _spec.loader is not None
spawnwatch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spawnwatch)

REAL = "real"

#: Fixtures that start a real part (or need one started): a test using any is `real`.
REAL_FIXTURES = frozenset({
    "image_root",  # exports the base image through the container engine
    "bwrap_root",  # every bwrap hardening case, on the host's dirs and on an image's root
    "warm_cargo",  # cargo builds the agentic task's crates
    "ray_cluster", "cluster",  # a Ray head
    "modal_sim",  # `metrale sandbox-sim modal`, bwrap sandboxes behind it
})  # fmt: skip

#: Files whose every test starts a real part (paths from the repository root).
REAL_FILES = frozenset({
    "tests/runtime/test_bwrap.py", "tests/runtime/test_bwrap_etc.py",
    "tests/runtime/test_bwrap_root.py", "tests/runtime/test_bwrap_stop.py",
    "tests/runtime/test_docker.py", "tests/runtime/test_ray.py",
    "tests/runtime/test_escapes.py", "tests/runtime/test_cleanup.py",
    "tests/faults/test_cleanup.py",
    "tests/endpoint/test_local.py", "tests/benchmarks/serve/test_serve_llama.py",
    "tests/benchmarks/agentic_webserver/test_smollm2.py",
    "tests/benchmarks/agentic_webserver/test_matrix.py",
    "tests/benchmarks/agentic_webserver/test_replays.py",
    "tests/benchmarks/terminal_bench/test_benchmark.py",
    "tests/benchmarks/terminal_bench/test_images.py",
    "tests/benchmarks/terminal_bench/test_builder.py",
    "tests/benchmarks/terminal_bench/test_bwrap_images.py",
    "tests/runtime/test_docker_read.py",
    "tests/benchmarks/terminal_bench/test_shipped.py",
    "tests/benchmarks/terminal_bench/test_dataset_runs.py",
    "tests/benchmarks/terminal_bench/test_network_runs.py",
    "tests/matrix/test_html.py",
    "tests/sandbox_sim/test_backend.py",
    "tests/runtime/test_prime.py",
    "tests/sandbox_sim/test_prime_sdk.py",
    "tests/sandbox_sim/test_modal_sdk.py", "tests/sandbox_sim/test_modal_runs.py",
})  # fmt: skip

#: Parameter ids (split on "-") that name a real runtime.
REAL_PARAMS = frozenset({"bwrap", "docker", "ray", "podman", "image", "prime", "modal"})


#: Source text that starts the metrale command line (not `metrale sim`) in a child process.
_CLI = re.compile(r'"-m",\s*"metrale",(?!\s*"sim")|-m metrale\b(?!\s+sim\b)')


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def runs_cli(func: object, seen: set[object] | None = None) -> bool:
    """Whether `func` (a test, a fixture), or a function of the test modules it calls, starts
    the metrale command line: its source matches `_CLI` (`-m metrale CMD`, CMD not `sim`)."""
    seen = set() if seen is None else seen
    if not inspect.isfunction(func):
        return False
    func = inspect.unwrap(func)
    if func in seen:
        return False
    seen.add(func)
    if not (func.__module__ or "").startswith("tests") or func.__module__ == __name__:
        return False
    try:
        if _CLI.search(inspect.getsource(func)):
            return True
    except (OSError, TypeError):
        return False
    names = func.__globals__
    return any(runs_cli(names.get(n), seen) for n in set(_code_names(func.__code__)))


def _fixture_funcs(item: pytest.Item) -> Iterator[object]:
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        for d in defs:
            yield d.func


def is_real(item: pytest.Item, root: Path) -> bool:
    """Whether `item` starts a real part, by the rules above (marker, fixture, path, params,
    what it calls)."""
    if item.get_closest_marker(REAL) is not None:
        return True
    if REAL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    try:
        path = Path(item.path).resolve().relative_to(root).as_posix()
    except ValueError:
        path = ""
    if path in REAL_FILES:
        return True
    params = item.name.partition("[")[2].rstrip("]")
    if params and REAL_PARAMS.intersection(params.split("-")):
        return True
    seen: set[object] = set()
    funcs = [getattr(item, "function", None), *_fixture_funcs(item)]
    return any(runs_cli(f, seen) for f in funcs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{REAL}: starts a real part (sandbox, container, llama.cpp, Ray, chromium, cargo); "
        "applied by tests/real_parts.py; `-m 'not real'` is the fast set",
    )
    # Python children load the spawn watch (it does nothing unless a log is named).
    paths = [str(_WATCH_DIR), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(config.rootpath).resolve()
    for item in items:
        if is_real(item, root):
            item.add_marker(REAL)


class _Watch:
    """What the test now running (not marked real) started: in-process and in children."""

    def __init__(self) -> None:
        self.active = False
        self.found: list[str] = []
        self.log: Path | None = None

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if not self.active:
            return
        if event == "subprocess.Popen":
            found = spawnwatch.real_part(args[1] if args[1] is not None else args[0])
        elif event == "ctypes.dlopen":
            found = spawnwatch.real_library(args[0])
        else:
            return
        if found is not None:
            self.found.append(f"{found} (in the test process)")


_watch = _Watch()
sys.addaudithook(_watch.audit)  # audit hooks cannot be removed: it checks `active` first


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker(REAL) is None:
        fd, name = tempfile.mkstemp(prefix="metrale-spawns-")
        os.close(fd)
        _watch.log, _watch.found, _watch.active = Path(name), [], True
        os.environ[spawnwatch.LOG_VARIABLE] = name
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if call.when != "teardown" or not _watch.active:
        return
    _watch.active = False
    os.environ.pop(spawnwatch.LOG_VARIABLE, None)
    found = list(_watch.found)
    if _watch.log is not None:
        found += _watch.log.read_text().splitlines()
        _watch.log.unlink(missing_ok=True)
        _watch.log = None
    if found:
        report = outcome.get_result()
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} starts a real part but is not marked `real`: "
            f"{'; '.join(dict.fromkeys(found))}. Mark it `@pytest.mark.real` (or use a fixture "
            "or file listed in tests/real_parts.py), so that `pytest -m 'not real'` stays fast."
        )
