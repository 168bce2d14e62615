"""What a build may use, without building: the base image mapping (user's, then defaults,
exact before globs), the network flag, and the host's CA bundle offered to RUN steps only."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale.benchmarks.terminal_bench.build_policy import (
    BUILD_CA_PATH,
    CA_VARIABLES,
    BuildPolicy,
    local_base,
    policy,
)
from metrale.runtime.configs import DEFAULT_IMAGE


@pytest.mark.parametrize(
    ("name", "mapping", "expected"),
    [
        ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", {}, DEFAULT_IMAGE),
        ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", {}, DEFAULT_IMAGE),
        ("ghcr.io/laude-institute/t-bench/anything:1", {}, DEFAULT_IMAGE),
        ("debian:bookworm", {}, DEFAULT_IMAGE),
        ("python:3.12", {}, "python:3.12"),  # not mapped: itself, to be found locally
        ("python:3.12", {"python:*": "my/py"}, "my/py"),
        ("python:3.12", {"python:*": "my/py", "python:3.12": "exact"}, "exact"),
        # the user's mapping wins over the defaults, for the public bases too
        ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:1", {"ghcr.io/*": "mine"}, "mine"),
    ],
)
def test_a_from_name_resolves_first_match_wins(
    name: str, mapping: dict[str, str], expected: str
) -> None:
    assert local_base(name, mapping) == expected


def test_the_ca_bundle_is_declared_after_every_from_and_mounted_read_only(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("cert")
    text = "ARG V=1\nFROM a AS b\nRUN x \\\n  y\nFROM --platform=p \\\n  b\nRUN z\n"
    out = BuildPolicy(ca_file=ca).dockerfile(text).splitlines()
    declare = "ARG " + " ".join(f"{v}={BUILD_CA_PATH}" for v in CA_VARIABLES)
    assert out == ["ARG V=1", "FROM a AS b", declare, "RUN x \\", "  y",
                   "FROM --platform=p \\", "  b", declare, "RUN z"]  # fmt: skip
    assert BuildPolicy(ca_file=ca).engine_args() == ["--volume", f"{ca}:{BUILD_CA_PATH}:ro"]
    assert BuildPolicy().dockerfile(text) == text and BuildPolicy().engine_args() == []
    assert BuildPolicy(network=False).engine_args() == ["--network=none"]


def test_the_flags_make_the_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "bundle.crt"
    ca.write_text("cert")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    assert policy({}) == BuildPolicy(network=True, ca_file=ca.resolve())
    assert policy({"build_ca": False}) == BuildPolicy(network=True, ca_file=None)
    # no network: nothing to verify, no bundle
    assert policy({"build_network": False}) == BuildPolicy(network=False, ca_file=None)
