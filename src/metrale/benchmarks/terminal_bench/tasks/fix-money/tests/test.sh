#!/bin/bash
# Verifier: the package's own tests as shipped (the copy in /tests, so an edited test file
# counts for nothing), the hidden contract tests, and the shipped test file unchanged.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app/ledger || { echo "FAIL: no /app/ledger"; exit 0; }
want=$(sha256sum /tests/test_money.py | awk '{print $1}')
got=$(sha256sum tests/test_money.py 2>/dev/null | awk '{print $1}')
[ "$want" = "$got" ] || { echo "FAIL: tests/test_money.py was changed"; exit 0; }
scratch=$(mktemp -d)
cp /tests/test_money.py /tests/test_hidden.py "$scratch"/
if PYTHONPATH=/app/ledger python3 -m unittest discover -s "$scratch" -t "$scratch" -v 2>&1; then
    echo 1 > /logs/verifier/reward.txt
    echo PASS
else
    echo "FAIL: unit tests"
fi
rm -rf "$scratch"
