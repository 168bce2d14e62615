"""`metrale cleanup --runtime prime`: the sandboxes the service still holds for dead runs.

Every sandbox metrale makes carries the `metrale` label and its owner's pid and host
(`prime_session.run_labels`). A sandbox whose owner ran on this host and is no longer alive is
deleted, in bulk (up to 100 ids per request); with `everything`, every metrale sandbox of the
account is (a live run's and another host's too). Blocking: the CLI calls it outside a loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metrale.runtime.base import CleanupReport
from metrale.runtime.prime_session import BATCH, HOST_PREFIX, LABEL, PID_PREFIX, host_label

PAGE = 100


def _label(labels: list[str], prefix: str) -> str:
    return next((label[len(prefix) :] for label in labels if label.startswith(prefix)), "")


def _owner_alive(pid: str) -> bool:
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def _metrale_sandboxes(client: Any) -> list[Any]:
    found: list[Any] = []
    page = 1
    while True:
        answer = client.list(labels=[LABEL], page=page, per_page=PAGE)
        found += answer.sandboxes
        if not answer.has_next or not answer.sandboxes:
            return found
        page += 1


def clean_sandboxes(report: CleanupReport, *, everything: bool = False) -> None:
    from prime_sandboxes import APIClient, SandboxClient

    client = SandboxClient(APIClient())
    here = host_label()[len(HOST_PREFIX) :]
    doomed: list[str] = []
    for sandbox in _metrale_sandboxes(client):
        if sandbox.status in ("TERMINATED", "ERROR", "TIMEOUT") and not everything:
            continue
        pid, host = _label(sandbox.labels, PID_PREFIX), _label(sandbox.labels, HOST_PREFIX)
        if not everything and host != here:
            report.kept.append(
                f"prime sandbox {sandbox.id} (made on host {host}; --all removes it)"
            )
        elif not everything and _owner_alive(pid):
            report.kept.append(f"prime sandbox {sandbox.id} (its run, pid {pid}, is alive)")
        else:
            doomed.append(sandbox.id)
    for at in range(0, len(doomed), BATCH):
        answer = client.bulk_delete(sandbox_ids=doomed[at : at + BATCH])
        report.removed += [f"prime sandbox {i}" for i in answer.succeeded]
        report.notes += [f"prime: could not delete {f}" for f in answer.failed]
