"""What the HTML report shows under each cell: its errors with their messages, its slowest
rollouts, and the agent transcripts of its run directory, as escaped HTML.

It reads the cell's run directory (`rollouts.jsonl`, and `transcripts/<index>.jsonl`: one JSON
message a line, what `metrale.agent.Agent` writes) and nothing a benchmark owns. Everything
shown is bounded (`Limits`), so a run of a million rollouts still makes a page a browser opens.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metrale.errors import UsageError, data_lines
from metrale.fmt import duration_text, number_text
from metrale.matrix.cellfile import CellResult
from metrale.plugin import SUMMARY_STAGES, Status
from metrale.plugin.per_task import dataset_line, per_task_table
from metrale.rundir import read_records

if TYPE_CHECKING:
    from metrale.rollout import RolloutRecord

TRANSCRIPTS_DIR = "transcripts"


@dataclass(frozen=True)
class Limits:
    errors: int = 50
    slowest: int = 10
    transcripts: int = 20
    messages: int = 200
    chars: int = 4000


def cell_run_dir(cell: CellResult, base: Path) -> Path | None:
    """The cell's run directory: as its file says, else where `metrale matrix` puts it
    (`<sweep>/runs/<cell>`, when the sweep moved), else `base` itself (a run directory)."""
    candidates = []
    if cell.run_dir:
        candidates.append(Path(cell.run_dir))
    candidates += [base / "runs" / cell.cell, base]
    for path in candidates:
        if (path / "run.json").is_file():
            return path
    return None


def drilldown_html(cell: CellResult, run_dir: Path | None, limits: Limits = Limits()) -> str:
    """The body of a cell's drill-down section (a dataset's per-task table first)."""
    return _per_task(cell) + _records_html(cell, run_dir, limits)


def _per_task(cell: CellResult) -> str:
    """A cell over a dataset: the dataset's line and a row per task (`plugin.per_task`)."""
    if len(cell.per_task) < 2:
        return ""
    k = int(cell.metrics.get("attempts") or 1)
    columns, rows = per_task_table(cell.per_task, k)
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td class='text'>{escape(str(x))}</td>" for x in row) + "</tr>"
        for row in rows
    )
    line = escape(dataset_line(cell.per_task, k))
    return f"<h3>tasks</h3><p>{line}</p><table><tr>{head}</tr>{body}</table>\n"


def _records_html(cell: CellResult, run_dir: Path | None, limits: Limits) -> str:
    if run_dir is None:
        return '<p class="note">no run directory found for this cell: only its summary.</p>'
    if cell.unit != "rollout":
        return (
            f'<p class="note">run directory: {escape(str(run_dir))} · {cell.records} '
            f"{escape(cell.unit)}s measured, {cell.errors} failed (per-{escape(cell.unit)} "
            "records are in the run directory)</p>"
        )
    try:
        records = read_records(run_dir / "rollouts.jsonl")
    except UsageError as exc:  # a damaged file must not cost the whole page
        where = escape(str(run_dir / "rollouts.jsonl"))
        return f'<p class="err">cannot read {where}: {escape(str(exc))}</p>'
    parts = [f'<p class="note">run directory: {escape(str(run_dir))} · {len(records)} records</p>']
    if cell.status == Status.FAILED and cell.error:
        parts.append(f'<p class="err">cell failed: {escape(cell.error)}</p>')
    parts.append(_errors(records, limits))
    parts.append(_slowest(records, limits))
    parts.append(_transcripts(records, run_dir, limits))
    return "\n".join(p for p in parts if p)


def _errors(records: list[RolloutRecord], limits: Limits) -> str:
    failed = [r for r in records if r.error is not None]
    if not failed:
        return "<h3>errors</h3><p>none</p>" if records else ""
    kinds = Counter(r.error.type for r in failed if r.error is not None)
    summary = ", ".join(f"{escape(k)} ×{n}" for k, n in kinds.most_common())
    rows = "".join(
        f"<tr><td>{r.index}</td><td>{escape(r.error.stage or '')}</td>"
        f"<td>{escape(r.error.type)}</td>"
        f"<td class='text'>{escape(_cut(r.error.message, 500))}</td></tr>"
        for r in failed[: limits.errors]
        if r.error is not None
    )
    more = len(failed) - limits.errors
    tail = f'<p class="note">… and {more} more</p>' if more > 0 else ""
    return (
        f"<h3>errors ({len(failed)}): {summary}</h3><table><tr><th>rollout</th><th>stage</th>"
        f"<th>type</th><th>message</th></tr>{rows}</table>{tail}"
    )


def _slowest(records: list[RolloutRecord], limits: Limits) -> str:
    timed = sorted((r for r in records if r.total_s is not None), key=lambda r: -(r.total_s or 0))
    if not timed:
        return ""
    head = "".join(f"<th>{s}</th>" for s in SUMMARY_STAGES)
    rows = []
    for r in timed[: limits.slowest]:
        stages = [r.stages[s].duration_s if s in r.stages else None for s in SUMMARY_STAGES[:-1]]
        cells = "".join(f"<td>{duration_text(x)}</td>" for x in [*stages, r.total_s])
        error = escape(r.error.type) if r.error is not None else ""
        rows.append(
            f"<tr><td>{r.index}</td>{cells}<td>{number_text(r.reward)}</td>"
            f"<td>{'' if r.turns is None else r.turns}</td><td class='err'>{error}</td></tr>"
        )
    return (
        f"<h3>slowest {min(limits.slowest, len(timed))} rollouts</h3><table><tr><th>rollout</th>"
        f"{head}<th>reward</th><th>turns</th><th>error</th></tr>{''.join(rows)}</table>"
    )


def _transcripts(records: list[RolloutRecord], run_dir: Path, limits: Limits) -> str:
    folder = run_dir / TRANSCRIPTS_DIR
    if not folder.is_dir():
        return ""
    by_index = {r.index: r for r in records}
    paths = sorted(folder.glob("*.jsonl"), key=lambda p: (not p.stem.isdigit(), _num(p.stem)))
    shown = []
    for path in paths[: limits.transcripts]:
        record = by_index.get(_num(path.stem))
        outcome = ""
        if record is not None:
            outcome = f" · reward {number_text(record.reward)} · {record.turns or 0} turns"
            if record.error is not None:
                outcome += f" · {escape(record.error.type)}"
        messages = _messages(path, limits)
        shown.append(
            f"<details><summary>rollout {escape(path.stem)}{outcome}</summary>{messages}</details>"
        )
    more = len(paths) - limits.transcripts
    tail = f'<p class="note">… and {more} more in {escape(str(folder))}</p>' if more > 0 else ""
    return f"<h3>agent transcripts ({len(paths)})</h3>" + "".join(shown) + tail


def _messages(path: Path, limits: Limits) -> str:
    out = []
    lines: list[bytes] = []
    try:  # regular files only, bounded: a transcript may be a FIFO or a link to /dev/zero
        for line in data_lines(path, "transcript"):
            lines.append(line)
            if len(lines) > limits.messages:
                break
    except UsageError as exc:
        return f'<p class="err">{escape(str(exc))}</p>'
    for line in lines[: limits.messages]:
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a torn last line (a crash mid-write)
        if not isinstance(message, dict):
            continue
        role = escape(str(message.get("role", "?")))
        body = _message_text(message)
        out.append(
            f'<div class="msg"><span class="role">{role}</span>'
            f"<pre>{escape(_cut(body, limits.chars))}</pre></div>"
        )
    if len(lines) > limits.messages:
        out.append(f'<p class="note">… more messages in {escape(str(path))}</p>')
    return "".join(out) or '<p class="note">empty transcript</p>'


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "\n".join(
            str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content
        )
    text = "" if content is None else str(content)
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        text += f"\n→ {fn.get('name', '?')}({fn.get('arguments', '')})"
    return text.strip()


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more chars]"


def _num(stem: str) -> int:
    return int(stem) if stem.isdigit() else -1
