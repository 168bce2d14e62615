"""What an image build may use, apart from what the rollouts may: the base image each `FROM`
runs on, the build's network, and the host's CA bundle.

- **Base images.** metrale never pulls. A `FROM` name resolves, first match wins, through the
  user's `--base-image NAME=LOCAL` mappings (NAME may be a glob: `ghcr.io/org/*=my/base`), then
  `DEFAULT_BASES`: the public Terminal-Bench base images
  (`ghcr.io/laude-institute/t-bench/ubuntu-24-04:<date>`, `python-3-13:<date>`, any other of
  that registry path) and `debian:bookworm` run on `metrale/base:bookworm`, the Debian image
  `scripts/container-engine.sh` builds from Debian's packages. A task that needs what its
  real base ships (Ubuntu's packages, Python 3.13) and the build does not install must be
  mapped to a local image that has it.
- **Build network** (`build_network`, on by default): the build's RUN steps reach what the
  machine reaches (the package registries), so `apt-get install` and `pip install` in a
  Dockerfile work; `--no-build-network` builds with no network at all. The rollouts'
  network is another policy: `allow_internet` of task.toml, exactly (`rollout.py`).
- **CA bundle** (`build_ca`, on by default with the network): the host's CA bundle is
  bind-mounted read-only at `BUILD_CA_PATH` during RUN steps and named by the variables
  tools read (`CA_VARIABLES`, as build `ARG`s: they are not in the image's environment).
  Where the registries are reached through a proxy whose CA the host trusts and the base
  image does not, pip and curl inside the build verify through it. `--no-build-ca` turns it
  off.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from metrale.runtime.configs import DEFAULT_IMAGE

#: Base images that need no mapping (exact names or globs), and the local image each runs on.
DEFAULT_BASES: dict[str, str] = {
    "debian:bookworm": DEFAULT_IMAGE,
    "debian:12": DEFAULT_IMAGE,
    "ghcr.io/laude-institute/t-bench/ubuntu-24-04:*": DEFAULT_IMAGE,
    "ghcr.io/laude-institute/t-bench/python-3-13:*": DEFAULT_IMAGE,
    "ghcr.io/laude-institute/t-bench/*": DEFAULT_IMAGE,
}
#: Where the host's CA bundle is during a build's RUN steps (not left in the image).
BUILD_CA_PATH = "/run/metrale-build-ca.pem"
#: The variables that point pip, requests, curl, OpenSSL, git and node at that bundle.
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)
#: Where a host keeps its CA bundle (Debian/Ubuntu, Fedora/RHEL, Alpine/SUSE).
HOST_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
)


@dataclass(frozen=True)
class BuildPolicy:
    """How a task's image is built (see the module docstring)."""

    network: bool = True
    #: the host CA bundle offered to RUN steps, or None
    ca_file: Path | None = None

    def engine_args(self) -> list[str]:
        """The build flags of this policy (podman's and docker's spelling alike)."""
        args = [] if self.network else ["--network=none"]
        if self.ca_file is not None:
            args += ["--volume", f"{self.ca_file}:{BUILD_CA_PATH}:ro"]
        return args

    def dockerfile(self, text: str) -> str:
        """`text` with the CA variables declared after each FROM, when a bundle is offered."""
        if self.ca_file is None:
            return text
        declare = "ARG " + " ".join(f"{name}={BUILD_CA_PATH}" for name in CA_VARIABLES)
        out: list[str] = []
        in_from = False
        for line in text.splitlines():
            out.append(line)
            in_from = in_from or bool(_FROM.match(line))
            if in_from and not line.rstrip().endswith("\\"):
                out.append(declare)
                in_from = False
        return "\n".join(out) + "\n"


_FROM = re.compile(r"^\s*FROM\s", re.IGNORECASE)


def host_ca_bundle() -> Path | None:
    """The host's CA bundle: $SSL_CERT_FILE when it names a file, else the usual places."""
    for candidate in (os.environ.get("SSL_CERT_FILE") or "", *HOST_CA_BUNDLES):
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    return None


def policy(values: Mapping[str, object]) -> BuildPolicy:
    """The run's build policy from its parameters (`build_network`, `build_ca`)."""
    network = values.get("build_network", True) is not False
    ca = network and values.get("build_ca", True) is not False
    return BuildPolicy(network=network, ca_file=host_ca_bundle() if ca else None)


def local_base(name: str, mapping: Mapping[str, str]) -> str:
    """The local image `FROM name` runs on: the user's mapping, then the defaults, exact names
    before globs; `name` itself when none matches."""
    for table in (mapping, DEFAULT_BASES):
        if name in table:
            return table[name]
        for pattern, local in table.items():
            if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(name, pattern):
                return local
    return name
