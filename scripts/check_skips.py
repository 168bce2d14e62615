"""Fail when the last pytest run skipped a test that this machine is meant to run.

`tests/conftest.py` records every skip (test id and reason) in the pytest cache as
`metrale/skips`; this script checks them against `tests/skips_allowed.toml`, where each allowed
skip names its test and reason (fnmatch patterns) and says why it is legitimate. CI calls it
after the README's test command, so a missing extra, tool or service shows as a red run, not
as a quietly shorter green one.

    python -m pytest && python scripts/check_skips.py
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / ".pytest_cache" / "v" / "metrale" / "skips"
ALLOWED = ROOT / "tests" / "skips_allowed.toml"


def load_allowed(path: Path) -> list[dict[str, str]]:
    entries = tomllib.loads(path.read_text()).get("allow", [])
    for i, entry in enumerate(entries):
        missing = {"test", "reason", "why"} - set(entry)
        if missing:
            raise ValueError(f"{path}: allow entry {i + 1} lacks {', '.join(sorted(missing))}")
    return entries


def unexpected(skips: list[dict[str, str]], allowed: list[dict[str, str]]) -> list[dict[str, str]]:
    return [
        s
        for s in skips
        if not any(
            fnmatch.fnmatchcase(s["test"], a["test"])
            and fnmatch.fnmatchcase(s["reason"], a["reason"])
            for a in allowed
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=LEDGER, help="the skips pytest recorded")
    parser.add_argument("--allowed", type=Path, default=ALLOWED, help="the allow-list (TOML)")
    args = parser.parse_args(argv)
    try:
        ledger = json.loads(args.ledger.read_text())
    except FileNotFoundError:
        print(f"check_skips: no skip ledger at {args.ledger}; run pytest first (with its cache "
              "enabled)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        allowed = load_allowed(args.allowed)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"check_skips: bad allow-list: {exc}", file=sys.stderr)
        return 2
    skips = ledger["skips"]
    bad = unexpected(skips, allowed)
    print(f"check_skips: {ledger['collected']} tests collected, {len(skips)} skipped, "
          f"{len(skips) - len(bad)} allowed")  # fmt: skip
    for s in bad:
        print(f"check_skips: not allowed to skip here: {s['test']}: {s['reason']}",
              file=sys.stderr)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
