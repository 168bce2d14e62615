#!/bin/bash
# Verifier: /app/report.txt byte for byte the expected summary (a diff is printed on failure).
mkdir -p /logs/verifier
if cmp -s /tests/expected_report.txt /app/report.txt; then
    echo PASS
    echo 1 > /logs/verifier/reward.txt
else
    echo "FAIL: /app/report.txt differs from the expected summary"
    diff /tests/expected_report.txt /app/report.txt 2>&1 | head -n 40
    echo 0 > /logs/verifier/reward.txt
fi
