"""Which `RUN --mount` a task's Dockerfile may use: the refusal in front of the image builder.

The podman/buildah of Debian 12 (4.3.1 / 1.28.2) have CVE-2024-1753: a bind mount whose source
is a symlink (in a stage, an image or the build context) is resolved on the host, so
`RUN --mount=type=bind,from=<stage with a link to />,...` runs the step over the host's root,
read-write, as host root. That builder cannot run a step in a user namespace (see
docs/security.md), so the construct is refused before any build, whatever the spelling:
continuations with either escape character, comment lines inside them, any case, `ARG`
substitution in the options. Only mounts that name no host path are accepted: `type=cache` and
`type=tmpfs` with literal options. The check is deliberately wider than the bug (any text that
reads `--mount` is a mount) so that a spelling the builder accepts and this reader does not
know is refused, never let through.
"""

from __future__ import annotations

import re

from metrale.errors import UsageError

#: Mount types that take nothing from the host or another image.
ALLOWED_TYPES = ("cache", "tmpfs")
ALLOWED_KEYS = frozenset(
    {"type", "target", "dst", "destination", "id", "sharing", "mode", "uid", "gid", "size"}
)
ACCEPTED = (
    "accepted: --mount=type=cache or type=tmpfs with literal target, id, sharing, mode, uid, "
    "gid, size"
)
_MOUNT = re.compile(r"--mount(?:\s*=\s*|\s+)(\"[^\"]*\"|'[^']*'|\S*)", re.IGNORECASE)
_LITERAL = re.compile(r"[A-Za-z0-9._/:+-]*")


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, joined text) of each instruction, continuations joined
    for both escape characters (`\\` and the `# escape=` backtick), blank and comment lines
    inside a continuation dropped, as the builder's parser does; a continued line's leading
    blanks are dropped too, so that `--mo\\` + `  unt` reads as `--mount`."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = number
            if line.lstrip().startswith("#"):  # a comment never continues
                out.append((start, line))
                continue
        # a continued line's indentation is dropped: wider than the parser, never narrower
        part = line.lstrip() if pending else line
        if line.endswith(("\\", "`")):
            pending += part[:-1]
            continue
        out.append((start, pending + part))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def mount_problem(spec: str) -> str | None:
    """Why one `--mount` value is refused, or None when it names no host path."""
    spec = spec.strip("\"'")
    options: dict[str, str] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        options[key.strip().lower()] = value.strip()
    kind = options.get("type", "bind")
    if kind not in ALLOWED_TYPES:
        return f"type={kind or '?'} mounts a path of the host or of another image"
    extra = sorted(set(options) - ALLOWED_KEYS)
    if extra:
        return f"option {extra[0]!r} is not accepted"
    for key, value in options.items():
        if not _LITERAL.fullmatch(value):
            return f"{key}={value!r} is not a literal (no $ substitution, quotes or spaces)"
    if ".." in options.get("id", "") or options.get("id", "").startswith("/"):
        return f"id={options['id']!r} must not climb out of the cache"
    return None


def check_mounts(task_name: str, text: str) -> None:
    """UsageError naming the task and the Dockerfile line of the first refused mount."""
    for number, line in logical_lines(text):  # comments too: refusing one costs nothing
        for match in _MOUNT.finditer(line):
            why = mount_problem(match.group(1))
            if why is not None:
                shown = " ".join(line.split())[:160]
                raise UsageError(
                    f"task {task_name}: environment/Dockerfile line {number} ({shown!r}) is "
                    f"refused: {why} ({ACCEPTED})"
                )
