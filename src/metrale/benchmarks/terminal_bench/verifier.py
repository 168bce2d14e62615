"""Scoring a Harbor task: its tests copied in only after the agent, test.sh run under the
verifier timeout, the reward read back from the file test.sh wrote.

Before test.sh runs, every process the agent left is killed (`Runtime.kill_commands`: a daemon
rewriting `reward.txt` cannot outlive the agent's phase), `/tests` is emptied and any reward
file removed: whatever the agent left there (a planted `reward.txt`) cannot score. The reward
is read inside the sandbox, a regular file only, at most `REWARD_MAX_BYTES`, within
`REWARD_READ_TIMEOUT_S`: a symlink to `/dev/zero`, a FIFO or a sparse 3 GB file is refused with
that reason, never read whole. Each way scoring can fail is an error with its own type on the
rollout: `verifier_timeout`, `no_reward` (test.sh wrote neither file), `bad_reward` (not a
regular file, too large, unreadable in time, not a finite number, or a reward.json with no
single numeric reward).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from metrale.runtime.base import Runtime

TESTS_DIR = "/tests"
REWARD_DIR = "/logs/verifier"
#: How much of the verifier's output a record keeps (head and tail).
OUTPUT_KEEP_CHARS = 4000
#: The largest reward file read: a number or a small JSON object of named rewards.
REWARD_MAX_BYTES = 64 << 10
#: How long reading one reward file may take (a FIFO swapped in after the check blocks).
REWARD_READ_TIMEOUT_S = 30.0
#: Reads file $0 inside the sandbox, at most $1 bytes, after checking it is a regular file
#: (not a link): exit 3 when it is absent, 4 for a symlink, 5 for anything not a regular file.
_READ_REWARD = (
    '[ -L "$0" ] && exit 4; [ -e "$0" ] || exit 3; [ -f "$0" ] || exit 5; exec head -c "$1" -- "$0"'
)
_NOT_READ = {
    4: "is a symlink (only a regular file is read)",
    5: "is not a regular file (a FIFO, a device or a directory)",
}


class SandboxIOError(OSError):
    """Files could not be put into the sandbox, or a preparing command failed there (an engine
    that lost an exec session under load, a full disk): the rollout's fault, not the run's."""

    kind = "sandbox_io"


class VerifierTimeout(Exception):
    kind = "verifier_timeout"


class NoReward(Exception):
    kind = "no_reward"


class BadReward(Exception):
    kind = "bad_reward"


@dataclass
class VerifierResult:
    exit_code: int
    output: str
    timed_out: bool
    duration_s: float
    reward: float | None = None
    #: every numeric entry of reward.json (Harbor allows several named rewards)
    rewards: dict[str, float] = field(default_factory=dict)


def keep(text: str, cap: int = OUTPUT_KEEP_CHARS) -> str:
    if len(text) <= cap:
        return text
    half = cap // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters elided ...]\n{text[-half:]}"


def _files(src: Path) -> list[tuple[str, bytes, bool]]:
    """(relative path, bytes, executable) of every regular file under `src`."""
    return [
        (path.relative_to(src).as_posix(), path.read_bytes(), os.access(path, os.X_OK))
        for path in sorted(src.rglob("*"))
        if path.is_file() and not path.is_symlink()
    ]


async def copy_dir(runtime: Runtime, src: Path, dest: str) -> None:
    """Every regular file under `src` into `dest` inside the runtime, executable bits kept."""
    executables: list[str] = []
    for rel, data, executable in await asyncio.to_thread(_files, src):
        target = f"{dest}/{rel}"
        try:
            await runtime.write(target, data)
        except OSError as exc:
            raise SandboxIOError(f"cannot copy {src.name}/{rel} to {target}: {exc}") from exc
        if executable:
            executables.append(target)
    if executables:
        done = await runtime.run(["chmod", "+x", "--", *executables], timeout=60)
        if done.exit_code != 0:
            why = (done.stderr.strip() or f"exit {done.exit_code}")[:300]
            raise SandboxIOError(f"cannot make {src.name}/'s scripts executable: {why}")


async def reset(runtime: Runtime) -> None:
    """An empty /tests and no reward file, whatever the agent did to them."""
    script = (
        f"mkdir -p {TESTS_DIR} {REWARD_DIR} && find {TESTS_DIR} -mindepth 1 -delete; "
        f"rm -rf {REWARD_DIR}/reward.txt {REWARD_DIR}/reward.json"
    )
    result = await runtime.run(script, timeout=60)
    if result.exit_code != 0:
        why = (result.stderr.strip() or f"exit {result.exit_code}")[:300]
        raise SandboxIOError(f"cannot prepare {TESTS_DIR} for the verifier: {why}")


async def verify(
    runtime: Runtime,
    tests: Path,
    *,
    workdir: str | None,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> VerifierResult:
    """Copy `tests`, run test.sh (task.toml's `[verifier.env]` added to its environment), read
    the reward; raises the typed errors above, each carrying the result so far as `.result`
    (the record keeps the verifier's output either way)."""
    try:  # nothing of the agent's phase runs past this point
        await runtime.kill_commands()
    except OSError as exc:
        why = f"cannot end the agent's processes before the verifier: {exc}"
        raise SandboxIOError(why) from exc
    await reset(runtime)
    await copy_dir(runtime, tests, TESTS_DIR)
    run = await runtime.run(
        ["bash", f"{TESTS_DIR}/test.sh"], cwd=workdir, timeout=timeout_s, env=env or None
    )
    result = VerifierResult(
        exit_code=run.exit_code,
        output=keep(run.stdout + run.stderr),
        timed_out=run.timed_out,
        duration_s=run.duration_s,
    )
    if run.timed_out:
        raise _with(VerifierTimeout(f"test.sh ran past the verifier timeout of {timeout_s:g} s"),
                    result)  # fmt: skip
    await read_reward(runtime, result)
    return result


def _with(exc: Exception, result: VerifierResult) -> Exception:
    exc.result = result  # type: ignore[attr-defined]  # the rollout reads getattr(exc, "result")
    return exc


async def _read(runtime: Runtime, path: str, result: VerifierResult) -> str | None:
    """The text of reward file `path`, None when it is absent; BadReward with the reason when
    it is there but not read (not a regular file, too large, not read in time)."""
    name = path.rsplit("/", 1)[-1]
    argv = ["sh", "-c", _READ_REWARD, path, str(REWARD_MAX_BYTES + 1)]
    done = await runtime.run(argv, timeout=REWARD_READ_TIMEOUT_S)
    if done.timed_out:
        why = f"{name} was not read within {REWARD_READ_TIMEOUT_S:g} s (a FIFO?)"
        raise _with(BadReward(why), result)
    if done.exit_code == 3:
        return None
    if done.exit_code in _NOT_READ:
        raise _with(BadReward(f"{name} {_NOT_READ[done.exit_code]}"), result)
    if done.exit_code != 0:
        why = (done.stderr.strip() or f"exit {done.exit_code}")[:200]
        raise _with(BadReward(f"{name} could not be read: {why}"), result)
    if len(done.stdout.encode()) + done.stdout_dropped > REWARD_MAX_BYTES:
        raise _with(BadReward(f"{name} is larger than {REWARD_MAX_BYTES} bytes"), result)
    return done.stdout


async def read_reward(runtime: Runtime, result: VerifierResult) -> None:
    """reward.txt (one number) wins over reward.json (`{"reward": x}`, or one numeric entry)."""
    text = await _read(runtime, f"{REWARD_DIR}/reward.txt", result)
    if text is not None:
        result.reward = _number(text.strip(), "reward.txt", result)
        return
    raw = await _read(runtime, f"{REWARD_DIR}/reward.json", result)
    if raw is None:
        raise _with(
            NoReward(f"test.sh (exit {result.exit_code}) wrote neither {REWARD_DIR}/reward.txt "
                     "nor reward.json"),
            result,
        )  # fmt: skip
    try:
        data = json.loads(raw)
    except ValueError:
        raise _with(BadReward(f"reward.json is not JSON: {raw[:80]!r}"), result) from None
    if isinstance(data, int | float) and not isinstance(data, bool):
        data = {"reward": data}
    if not isinstance(data, dict):
        raise _with(BadReward("reward.json is not an object of named rewards"), result)
    result.rewards = {
        k: float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    if "reward" in data:
        result.reward = _number(str(data["reward"]), "reward.json's reward", result)
    elif len(result.rewards) == 1:
        result.reward = next(iter(result.rewards.values()))
    else:
        names = ", ".join(sorted(map(str, data))) or "nothing"
        raise _with(BadReward(f"reward.json has no 'reward' and not one number ({names})"), result)


def _number(text: str, what: str, result: VerifierResult) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _with(BadReward(f"{what} is not a number: {text[:80]!r}"), result) from None
    if not math.isfinite(value):
        raise _with(BadReward(f"{what} is not finite: {text[:80]!r}"), result)
    return value
