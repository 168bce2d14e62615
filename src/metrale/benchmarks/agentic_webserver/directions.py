"""The six directions of the prompt, each checked from the commands the agent ran.

Commands are read as shell text, split into segments at `;`, `&&`, `||`, `|`, a background `&`
and newlines (quotes and `$(...)` are not parsed: a separator inside them also splits, which
errs towards reading more segments, never fewer). A command in a segment is *wrapped in
timeout* when the word `timeout` comes before it in the segment (`timeout 15 curl ...`,
`OUT=$(timeout 15 curl ...)`). Each rule is written in the
docstring of its check; a check is passed or missed, and a row's note names the missed ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from metrale.agent import CommandRecord

_SEPARATOR = re.compile(r"&&|\|\||;|\n|\|(?!\|)|(?<![>&<])&(?![>&])")
_TIMEOUT = re.compile(r"(?<![\w-])timeout\s")
_CURL = re.compile(r"(?<![\w-])curl\b")
_SERVER = re.compile(r"\bcargo\s+(?:\+\S+\s+)?run\b|target/(?:debug|release)/[\w.-]+")
_DETACH = re.compile(r"\b(?:setsid|nohup)\b|\bdisown\b|\bstart-stop-daemon\b")
_STDOUT_REDIRECT = re.compile(r"(?:^|\s|\d)(?:&>>?|>>?)\s*\S")
_STDERR_REDIRECT = re.compile(r"2>&1|&>>?|2>>?\s*\S|>&\s*\S")
_KILLER = re.compile(r"\b(?:fuser|kill|kill-port|ss|lsof)\b")
_LSOF_T_I = r"lsof\b(?=[^)|;\n]*\s-\w*t)(?=[^)|;\n]*\s-\w*i)"
_FUSER_K = re.compile(r"\bfuser\b(?=[^;|\n]*\s-\w*k)(?=[^;|\n]*(?:/tcp\b|-n\s+tcp\b))")
_KILL_LSOF = re.compile(r"\bkill\b[^\n]*\$\(\s*(?:timeout\s+\S+\s+)?" + _LSOF_T_I)
_LSOF_XARGS = re.compile(_LSOF_T_I + r"[^\n]*\|\s*(?:\w+\s+)*xargs\b[^\n]*\bkill\b")
_PORT_KILLERS = re.compile(r"\bkill-port\b|\bss\b[^\n]*\s-K\b")
_BY_PORT = (_FUSER_K, _KILL_LSOF, _LSOF_XARGS, _PORT_KILLERS)


@dataclass(frozen=True)
class Segment:
    text: str
    background: bool
    command: CommandRecord


def wrapped(text: str, pattern: re.Pattern[str]) -> bool:
    """`timeout` comes before the first match of `pattern` in `text`."""
    found = pattern.search(text)
    return found is not None and bool(_TIMEOUT.search(text[: found.start()]))


def segments(commands: Sequence[CommandRecord]) -> list[Segment]:
    out: list[Segment] = []
    for record in commands:
        text, start = record.command, 0
        for sep in _SEPARATOR.finditer(text):
            piece = text[start : sep.start()]
            if piece.strip():
                out.append(Segment(piece.strip(), sep.group() == "&", record))
            start = sep.end()
        if text[start:].strip():
            out.append(Segment(text[start:].strip(), False, record))
    return out


def tests_passed(commands: Sequence[CommandRecord]) -> bool:
    """Tests were run and passed: a command running `cargo test` (not `--no-run`) exited 0 and
    its output has a `test result: ok. N passed` line with N >= 1."""
    for c in commands:
        if re.search(r"\bcargo\s+(?:\+\S+\s+)?test\b", c.command) and "--no-run" not in c.command:
            ran = re.findall(r"test result: ok\. (\d+) passed", c.output)
            if c.exit_code == 0 and not c.timed_out and any(int(n) > 0 for n in ran):
                return True
    return False


def server_detached(commands: Sequence[CommandRecord]) -> bool:
    """The server was started detached with its output redirected: a segment that starts the
    server (`cargo run` or a `target/debug|release/` binary) is backgrounded with `&`, detached
    (`setsid` or `nohup` in it, or `disown` in the same command), and sends both stdout and
    stderr to a file (`> f 2>&1`, `&> f`, or `> f 2> g`)."""
    for seg in segments(commands):
        if not (seg.background and _SERVER.search(seg.text)):
            continue
        detached = bool(_DETACH.search(seg.text)) or "disown" in seg.command.command
        redirected = bool(_STDOUT_REDIRECT.search(seg.text) and _STDERR_REDIRECT.search(seg.text))
        if detached and redirected:
            return True
    return False


def curl_proved(commands: Sequence[CommandRecord]) -> bool:
    """curl proved it works: a command with a curl of a `/ping` URL exited 0 (not timed out) and
    its output contains `pong`."""
    for c in commands:
        curled = _CURL.search(c.command) and "/ping" in c.command
        if curled and c.exit_code == 0 and not c.timed_out and "pong" in c.output:
            return True
    return False


def curl_timeout(commands: Sequence[CommandRecord]) -> bool:
    """The curl was wrapped in `timeout`: there is at least one curl, and every segment that
    runs curl has `timeout` before the curl (curl's own `--max-time` does not count: the prompt asks
    for `timeout`)."""
    curls = [s for s in segments(commands) if _CURL.search(s.text)]
    return bool(curls) and all(wrapped(s.text, _CURL) for s in curls)


def _teardowns(commands: Sequence[CommandRecord]) -> list[Segment]:
    found = []
    for seg in segments(commands):
        text = seg.text
        # `kill $(lsof -t -i:PORT)` spans a split at `$(`'s inner separators: read the command
        if any(p.search(text) for p in _BY_PORT) or (
            "lsof" in text and any(p.search(seg.command.command) for p in (_KILL_LSOF, _LSOF_XARGS))
        ):
            found.append(seg)
    return found


def teardown_by_port(commands: Sequence[CommandRecord]) -> bool:
    """Teardown killed by port: some command kills whatever listens on the port, as `fuser -k
    PORT/tcp` (any flags or port spelling), `kill $(lsof -t -i:PORT)`, `lsof -t -i:PORT | xargs
    kill`, `kill-port` or `ss -K`. Killing by name (`pkill`, `killall`) does not count."""
    return bool(_teardowns(commands))


def teardown_timeout(commands: Sequence[CommandRecord]) -> bool:
    """The teardown was wrapped in `timeout`: there is a by-port teardown, and every by-port
    teardown segment has `timeout` before its `fuser`, `kill`, `kill-port` or `ss`."""
    found = _teardowns(commands)
    return bool(found) and all(wrapped(s.text, _KILLER) for s in found)


#: The six checks in the order of the prompt; their names are the per-step metric names.
CHECKS: dict[str, Callable[[Sequence[CommandRecord]], bool]] = {
    "tests_passed": tests_passed,
    "server_detached": server_detached,
    "curl_proved": curl_proved,
    "curl_timeout": curl_timeout,
    "teardown_by_port": teardown_by_port,
    "teardown_timeout": teardown_timeout,
}


def check_directions(commands: Sequence[CommandRecord]) -> dict[str, bool]:
    return {name: check(commands) for name, check in CHECKS.items()}
