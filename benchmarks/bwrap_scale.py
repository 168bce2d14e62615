"""gsm8k xN in bwrap, unbounded, against the bare-bwrap floor measured in the same run.

Each repeat, for each N, side by side:

- **floor** (issue 27's, exactly): N of `bwrap --unshare-all --unshare-user --ro-bind /usr /usr
  --ro-bind /lib /lib --ro-bind /bin /bin [--ro-bind /lib64 /lib64] --proc /proc --dev /dev
  --tmpfs /tmp --die-with-parent true` started at once from a shell (`&` each, then `wait`),
  timed by the shell from before the first spawn to after the last exit;
- **metrale**: `metrale run gsm8k --runtime bwrap --rollouts N` (no `--max-concurrent`) against
  `metrale sim` answering in `--latency` s, in its own process; e2e and the stage p50s from its
  result.json; then, 1 s after it exited, what it left: processes naming its sandboxes,
  workdirs and cgroups named after its pid (`metrale-bwrap-<pid>-*`; all must be 0);
- with `--before DIR` (a source tree, e.g. an older commit's `src`), the same cell run from that
  tree right after, so before and after are interleaved pairs against the same floors;
- with `--tmpdir DIR`, this tree's cell once more with `TMPDIR=DIR` (where sandbox temp dirs
  go: `/dev/shm` puts them on a tmpfs), labelled `now@DIR`, interleaved the same way.

ratio = e2e / (floor + latency), per pair; medians are quoted. Target (issue 27): <= 2.0 at
512 and 1,024, 0 errors, nothing left.

    python benchmarks/bwrap_scale.py --rollouts 512,1024 --repeats 3 [--before /tmp/base/src]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import machine, sim

FLOOR_SCRIPT = r"""
binds=(--ro-bind /usr /usr --ro-bind /lib /lib --ro-bind /bin /bin)
[ -e /lib64 ] && binds+=(--ro-bind /lib64 /lib64)
start=$(date +%s%N)
for _ in $(seq "$1"); do
  bwrap --unshare-all --unshare-user "${binds[@]}" --proc /proc --dev /dev --tmpfs /tmp \
    --die-with-parent true &
done
fail=0
for job in $(jobs -p); do wait "$job" || fail=$((fail + 1)); done
end=$(date +%s%N)
echo "$(( end - start )) $fail"
"""
PREFIX = "metrale-bwrap-"
#: the `--tmpdir` given, where `left_behind` looks too
TMPDIRS: list[str] = []


def floor(n: int) -> float:
    """Seconds for `n` bare `bwrap ... true` started at once from bash, all exited."""
    out = subprocess.run(["bash", "-c", FLOOR_SCRIPT, "floor", str(n)], capture_output=True,
                         text=True, check=True).stdout.split()  # fmt: skip
    if out[1] != "0":
        raise SystemExit(f"bare bwrap failed in {out[1]} of {n}")
    return int(out[0]) / 1e9


def left_behind(pid: int) -> dict[str, int]:
    """What metrale process `pid` left: processes whose command line names one of its
    sandboxes (bwrap and its wrappers), its workdirs, its cgroups."""
    mark = f"{PREFIX}{pid}-"
    procs = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                procs += mark.encode() in Path(f"/proc/{entry}/cmdline").read_bytes()
    roots = {tempfile.gettempdir(), "/tmp", "/dev/shm", *TMPDIRS}  # /dev/shm: control dirs
    dirs = {p for d in roots for p in Path(d).glob(f"{mark}*")}
    groups = 0
    for root in ("pids", "memory", "unified"):
        # os.walk skips what vanishes under it: other runs' cgroups come and go meanwhile
        for _, names, _ in os.walk(Path("/sys/fs/cgroup") / root):
            groups += sum(1 for name in names if name.startswith(mark))
    return {"procs_left": procs, "dirs_left": len(dirs), "cgroups_left": groups}


def metrale_cell(
    url: str, n: int, src: str, extra: list[str], tmpdir: str | None = None
) -> dict[str, float | int | None]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "metrale", "run", "gsm8k", "--target", url,
                "--model", "metrale-sim", "--runtime", "bwrap", "--rollouts", str(n),
                "--max-tokens", "16", "--no-preflight", "--quiet", "--out", str(out),
                *extra]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": src, **({"TMPDIR": tmpdir} if tmpdir else {})}
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _stdout, stderr = proc.communicate()
        process_s = time.perf_counter() - started
        time.sleep(1.0)
        left = left_behind(proc.pid)
        if proc.returncode != 0:
            print(stderr.decode(errors="replace")[-2000:], file=sys.stderr)
        result = json.loads((out / "result.json").read_text())["result"]
    metrics = result["metrics"]
    row: dict[str, float | int | None] = {
        "e2e_s": metrics["e2e_s"],
        "process_s": process_s,
        "errors": metrics["errors"],
        **left,
        "exit": proc.returncode,
    }
    for stage in ("setup_wait", "setup", "generation", "scoring", "stop", "total"):
        row[stage] = metrics.get(stage)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", default="512", help="comma list of N (default 512)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--before", metavar="SRC", help="also run the cell from this source tree")
    ap.add_argument("--tmpdir", help="also run this tree's cell with TMPDIR set to this")
    ap.add_argument("--extra", default="", help="more flags for metrale run, space separated")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent.parent / "src")
    trees = {"now": (here, None), **({"before": (args.before, None)} if args.before else {})}
    if args.tmpdir:
        trees[f"now@{args.tmpdir}"] = (here, args.tmpdir)
        TMPDIRS.append(args.tmpdir)
    sizes = [int(n) for n in args.rollouts.split(",")]
    rows: dict[tuple[int, str], list[dict[str, float | int | None]]] = {}
    with sim("--ttft", str(args.latency), "--output-tokens", "16") as url:
        for i in range(args.repeats):
            for n in sizes:
                floor_s = floor(n)
                for label, (src, tmpdir) in trees.items():
                    made = metrale_cell(url, n, src, args.extra.split(), tmpdir)
                    row = {"floor_s": floor_s, **made}
                    row["ratio"] = row["e2e_s"] / (floor_s + args.latency)  # type: ignore[operator]
                    rows.setdefault((n, label), []).append(row)
                    shown = {k: _r(v) for k, v in row.items()}
                    print(f"repeat {i} n={n} {label}: {json.dumps(shown)}", flush=True)
    for (n, label), cell in rows.items():
        keys = [k for k in cell[0] if all(isinstance(r[k], int | float) for r in cell)]
        med = {k: _r(statistics.median(float(r[k]) for r in cell)) for k in keys}  # type: ignore[arg-type]
        pairs = " / ".join(f"{r['ratio']:.2f}" for r in cell)
        print(f"median n={n} {label}: {json.dumps(med)}")
        print(f"  ratio e2e / (floor + {args.latency}) per pair: {pairs}; median {med['ratio']}")
    print(machine() + f", load {os.getloadavg()[0]:.1f}")
    return 0


def _r(x: object) -> object:
    return round(x, 3) if isinstance(x, float) else x


if __name__ == "__main__":
    raise SystemExit(main())
