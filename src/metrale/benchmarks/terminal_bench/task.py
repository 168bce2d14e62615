"""A task in the Harbor layout, read and checked before any work.

A task is a directory: `instruction.md` (the prompt, verbatim), `task.toml` (`version`,
`[metadata]`, `[agent] timeout_sec`, `[verifier] timeout_sec`, `[environment]` with
`build_timeout_sec`, `cpus`, `memory_mb` or `memory = "2G"`, `storage_mb`, `allow_internet`,
`docker_image`, `workdir`, `gpus`, `mcp_servers`), `[verifier.env]` and `[solution.env]`
(string variables for test.sh and solve.sh), `environment/Dockerfile` and its build context,
`tests/test.sh` (copied to `/tests` after the agent, run as root, writes
`/logs/verifier/reward.txt` or `reward.json`), and optionally `solution/solve.sh` (what the
oracle agent runs).

Every way a task directory can be wrong is a `UsageError` naming the file and the problem, so
that a run with a broken task stops before an image is built or a sandbox started. Keys this
reader does not know are accepted (Harbor adds sections over time); known keys of the wrong type
are not. Fields a task may carry but no runtime here provides (`gpus > 0`, `mcp_servers`) are
not errors of the file: `refusals` names them, and the dataset skips that task with the reason.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from metrale.benchmarks.terminal_bench.build_mounts import check_mounts
from metrale.bounds import CPUS, MEMORY_MB, TIMEOUT_S, Bound
from metrale.errors import UsageError, read_user_file

#: Harbor's defaults where task.toml is silent.
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
_UNITS = {"": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Environment:
    """`[environment]` of task.toml."""

    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    allow_internet: bool = True
    docker_image: str | None = None
    #: where the agent starts (and solve.sh, test.sh run): overrides the image's WORKDIR
    workdir: str | None = None
    gpus: int = 0
    #: `[[environment.mcp_servers]]`: MCP servers the agent is to be given
    mcp_servers: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Dockerfile:
    """What metrale needs of environment/Dockerfile: its base images and final WORKDIR."""

    text: str
    #: `FROM` images in order, stage names (`FROM a AS b` ... `FROM b`) excluded
    bases: tuple[str, ...]
    workdir: str | None


@dataclass(frozen=True)
class HarborTask:
    name: str
    path: Path
    instruction: str
    version: str | None
    metadata: dict[str, Any]
    agent_timeout_s: float
    verifier_timeout_s: float
    environment: Environment
    dockerfile: Dockerfile | None
    has_solution: bool
    extra: dict[str, Any] = field(default_factory=dict)
    #: `[verifier.env]`: added to test.sh's environment
    verifier_env: dict[str, str] = field(default_factory=dict)
    #: `[solution.env]`: added to solve.sh's environment (the oracle)
    solution_env: dict[str, str] = field(default_factory=dict)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


def shipped_tasks_dir() -> Path:
    return Path(str(resources.files("metrale.benchmarks.terminal_bench") / "tasks"))


def shipped_task_names() -> list[str]:
    root = shipped_tasks_dir()
    return sorted(p.name for p in root.iterdir() if (p / "task.toml").is_file())


def resolve_task_dir(spec: str) -> Path:
    """`spec` is a task directory, or the name of a task shipped with metrale."""
    if not spec.strip():
        raise UsageError("parameter task is empty; accepted: a task directory or a shipped task")
    path = Path(spec).expanduser()
    if path.is_dir():
        return path.resolve()
    shipped = shipped_tasks_dir() / spec
    if "/" not in spec and shipped.is_dir():
        return shipped
    names = ", ".join(shipped_task_names())
    raise UsageError(
        f"task {spec!r} is neither a directory nor a task shipped with metrale; "
        f"shipped tasks: {names}"
    )


def load_task(spec: str) -> HarborTask:
    """Read and check the task `spec` names; `UsageError` (file + problem) when it is bad."""
    path = resolve_task_dir(spec)
    for rel in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (path / rel).is_file():
            raise UsageError(f"task {path}: {rel} is missing; a Harbor task needs {rel}")
    instruction = read_user_file(path / "instruction.md", "task instruction")
    if not instruction.strip():
        raise UsageError(f"task {path}: instruction.md is empty")
    toml_path = path / "task.toml"
    try:
        # a byte-order mark (editors on Windows write one) is not TOML's, but harmless
        data = tomllib.loads(read_user_file(toml_path, "task config").removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{toml_path}: not valid TOML ({exc})") from None
    where = str(toml_path)
    version = data.get("version")
    if version is not None and not isinstance(version, str | int | float):
        raise UsageError(f'{where}: version must be a string such as "1.0"')
    metadata = _table(data, "metadata", where)
    agent = _table(data, "agent", where)
    verifier = _table(data, "verifier", where)
    env = _table(data, "environment", where)
    environment = Environment(
        build_timeout_s=_number(env, "build_timeout_sec", where, DEFAULT_BUILD_TIMEOUT_S),
        cpus=_number(env, "cpus", where, None, bound=CPUS),
        memory_mb=_memory_mb(env, where),
        storage_mb=_number(env, "storage_mb", where, None, bound=STORAGE_MB),
        allow_internet=_bool(env, "allow_internet", where, True),
        docker_image=_str(env, "docker_image", where),
        workdir=_workdir(env, where),
        gpus=int(_number(env, "gpus", where, 0, bound=GPUS)),
        mcp_servers=_mcp_servers(env, where),
    )
    solution = _table(data, "solution", where)
    dockerfile_path = path / "environment" / "Dockerfile"
    dockerfile = None
    if dockerfile_path.is_file():
        dockerfile = parse_dockerfile(read_user_file(dockerfile_path, "task Dockerfile"))
        if not re.search(r"^\s*FROM\s", dockerfile.text, re.IGNORECASE | re.MULTILINE):
            raise UsageError(f"{dockerfile_path}: no FROM line")
        check_mounts(path.name, dockerfile.text)
    elif environment.docker_image is None:
        raise UsageError(
            f"task {path}: environment/Dockerfile is missing and task.toml names no "
            "[environment] docker_image; a Harbor task needs one of them"
        )
    return HarborTask(
        name=path.name,
        path=path,
        instruction=instruction,
        version=None if version is None else str(version),
        metadata=metadata,
        agent_timeout_s=_number(agent, "timeout_sec", where, DEFAULT_AGENT_TIMEOUT_S, "agent"),
        verifier_timeout_s=_number(
            verifier, "timeout_sec", where, DEFAULT_VERIFIER_TIMEOUT_S, "verifier"
        ),
        environment=environment,
        dockerfile=dockerfile,
        has_solution=(path / "solution" / "solve.sh").is_file(),
        extra={k: v for k, v in data.items() if k not in _KNOWN},
        verifier_env=_env(verifier, "verifier", where),
        solution_env=_env(solution, "solution", where),
    )


_KNOWN = ("version", "metadata", "agent", "verifier", "environment", "solution")


def refusals(task: HarborTask, *, provides: frozenset[str] = frozenset()) -> list[str]:
    """What the task asks for that no runtime here gives, one line each naming the task and
    the field (`provides`: what the chosen runtime declares it gives, e.g. "gpus")."""
    where = f"task {task.name}: task.toml [environment]"
    found = []
    if task.environment.gpus > 0 and "gpus" not in provides:
        found.append(f"{where} gpus = {task.environment.gpus}: no runtime here provides GPUs")
    if task.environment.mcp_servers and "mcp_servers" not in provides:
        n = len(task.environment.mcp_servers)
        found.append(f"{where} mcp_servers ({n}): no agent here is given MCP servers")
    return found


def network_refusal(task: HarborTask, runtime: str, *, cuts: bool, gives: bool) -> str | None:
    """One line naming the task and the field when the runtime cannot follow its
    `allow_internet` exactly (`cuts`: it can cut a sandbox off every network; `gives`: it can
    give one a network beyond loopback), else None."""
    where = f"task {task.name}: task.toml [environment] allow_internet"
    if task.environment.allow_internet and not gives:
        return f"{where} = true: the {runtime} runtime cannot give a sandbox a network"
    if not task.environment.allow_internet and not cuts:
        return f"{where} = false: the {runtime} runtime cannot cut a sandbox off the network"
    return None


#: GPUs a task may ask for (only 0 runs here).
GPUS = Bound(0, 1024, integer=True, unit="GPUs")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env(table: dict[str, Any], section: str, where: str) -> dict[str, str]:
    """`[<section>.env]`: NAME = "value" (numbers and booleans written as text)."""
    value = table.get("env", {})
    if not isinstance(value, dict):
        raise UsageError(f'{where}: [{section}.env] must be a table of NAME = "value"')
    out: dict[str, str] = {}
    for name, item in value.items():
        if not _ENV_NAME.match(name):
            raise UsageError(f"{where}: [{section}.env] {name!r} is not a variable name")
        if isinstance(item, bool):
            item = "true" if item else "false"
        if not isinstance(item, str | int | float) or "\0" in str(item):
            raise UsageError(f"{where}: [{section}.env] {name} must be a string, not {item!r}")
        out[name] = str(item)
    return out


def _workdir(table: dict[str, Any], where: str) -> str | None:
    value = _str(table, "workdir", where)
    if value is not None and (not value.startswith("/") or "\0" in value):
        raise UsageError(f"{where}: [environment] workdir {value!r} must be an absolute path")
    return value


def _mcp_servers(table: dict[str, Any], where: str) -> tuple[Any, ...]:
    value = table.get("mcp_servers", [])
    if not isinstance(value, list):
        raise UsageError(f"{where}: [environment] mcp_servers must be a list of tables")
    return tuple(value)


def _table(data: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise UsageError(f"{where}: [{name}] must be a table")
    return value


#: A task's disk: 1 MB up to 16 TB.
STORAGE_MB = Bound(1, 16 * 2**20, integer=True, unit="MB")


def _number(
    table: dict[str, Any],
    key: str,
    where: str,
    default: Any,
    section: str = "environment",
    *,
    bound: Bound = TIMEOUT_S,
) -> Any:
    """`table[key]` within `bound` (`metrale.bounds`: NaN and infinities refused), else one
    line naming the file, the field and the accepted range."""
    if key not in table:
        return default
    value = bound.check(table[key], f"{where}: [{section}] {key}")
    return value if bound.integer else float(value)


def _bool(table: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise UsageError(f"{where}: [environment] {key} must be true or false, not {value!r}")
    return value


def _str(table: dict[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{where}: [environment] {key} must be a non-empty string")
    return value.strip()


def _memory_mb(table: dict[str, Any], where: str) -> int | None:
    """`memory_mb = 2048` or `memory = "2G"` (K, M, G, T; optional `B`/`iB`), not both."""
    if "memory_mb" in table and "memory" in table:
        raise UsageError(f"{where}: [environment] has both memory and memory_mb; give one")
    if "memory_mb" in table:
        return int(_number(table, "memory_mb", where, None, bound=MEMORY_MB))
    raw = table.get("memory")
    if raw is None:
        return None
    match = _MEMORY.match(str(raw)) if isinstance(raw, str | int) else None
    if match is None or isinstance(raw, bool):
        raise UsageError(
            f'{where}: [environment] memory = {raw!r} is not a size; accepted: e.g. "2G", "512M"'
        )
    mb = float(match.group(1)) * _UNITS[match.group(2).lower()]
    return int(MEMORY_MB.check(int(mb), f"{where}: [environment] memory = {raw!r} (MB)"))


_ARG = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}?")


def parse_dockerfile(text: str) -> Dockerfile:
    """Base images and the final stage's WORKDIR, with line continuations, comments, global
    `ARG` defaults in `FROM`, `--platform=` and stage names handled; enough to find what
    must be present locally, not a full Dockerfile parser."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    workdir: str | None = None
    seen_from = False
    for line in logical:
        word, _, rest = line.partition(" ")
        word = word.upper()
        rest = rest.strip()
        if word == "ARG" and not seen_from:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif word == "FROM":
            seen_from = True
            parts = [p for p in rest.split() if not p.startswith("--")]
            if not parts:
                continue
            image = _ARG.sub(lambda m: args.get(m.group(1)) or (m.group(2) or ""), parts[0])
            if image.lower() not in stages and image != "scratch":
                bases.append(image)
            if len(parts) >= 3 and parts[1].upper() == "AS":
                stages.add(parts[2].lower())
            workdir = None
        elif word == "WORKDIR" and rest:
            target = rest.strip('"')
            workdir = target if target.startswith("/") else f"{workdir or '/'}/{target}"
    return Dockerfile(text=text, bases=tuple(bases), workdir=workdir)
