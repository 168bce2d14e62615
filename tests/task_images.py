"""Task images a test session built, removed when it ends: a terminal task's image
(`metrale-task/<name>:<hash>`) is cached by the engine on purpose, so that a second run of the
same task reuses it, and the tests' own tasks (written into temp dirs, each edit a new hash)
would otherwise pile up in `docker images` run after run.

The engine is asked only once a `real` test has run (the fast set never touches it), and its
listing at that moment is kept: what was there before the session (a user's own runs' images)
stays. Under pytest-xdist nothing is removed (a worker that finished first would take an image
from under the other's running test); CI runs the real tests in one process.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REFERENCE = "metrale-task/*"


def engine_cli() -> str | None:
    return shutil.which("docker") or shutil.which("podman")


def task_images(cli: str) -> set[str] | None:
    """The engine's `metrale-task/*` images by name:tag, or None when it cannot be asked."""
    try:
        listed = subprocess.run(
            [cli, "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter",
             f"reference={REFERENCE}"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return {line for line in listed.stdout.split() if ":" in line}


class _Listing:
    """The engine's listing when the session's first real test started."""

    asked = False
    cli: str | None = None
    before: set[str] | None = None  # None: the engine could not be asked


@pytest.fixture(autouse=True)
def _real_tests_take_their_task_images_away(request: pytest.FixtureRequest) -> None:
    if _Listing.asked or request.node.get_closest_marker("real") is None:
        return
    _Listing.asked = True
    _Listing.cli = engine_cli()
    _Listing.before = task_images(_Listing.cli) if _Listing.cli else None


def remove_what_the_session_built() -> None:
    """From `pytest_sessionfinish`: after every test and fixture has ended, outside any test
    (the real-part audit of `tests/real_parts.py` watches tests, and this is none)."""
    cli, before = _Listing.cli, _Listing.before
    if cli is None or before is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    built = sorted((task_images(cli) or set()) - before)
    if built:
        subprocess.run([cli, "rmi", "-f", *built], capture_output=True, timeout=300, check=False)
