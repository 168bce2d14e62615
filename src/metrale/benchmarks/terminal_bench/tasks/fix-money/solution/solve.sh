#!/bin/bash
# The oracle: parse with exact decimal arithmetic and an explicit pattern, not float.
set -euo pipefail
cd /app/ledger
python3 - <<'PY'
import re
from pathlib import Path

path = Path("ledger/money.py")
text = path.read_text()
old = "    value = float(text)\n    return int(value * 100)\n"
new = '''    match = re.fullmatch(r"\\s*([+-]?)(\\d+)(?:\\.(\\d{1,2}))?\\s*", text)
    if match is None:
        raise ValueError(f"not an amount: {text!r}")
    sign, whole, frac = match.groups()
    cents = int(whole) * 100 + int((frac or "0").ljust(2, "0"))
    return -cents if sign == "-" else cents
'''
assert old in text, "money.py is not the version this solution fixes"
text = text.replace(old, new).replace("from __future__ import annotations\n",
                                      "from __future__ import annotations\n\nimport re\n")
path.write_text(text)
PY
python3 -m unittest discover -s tests
