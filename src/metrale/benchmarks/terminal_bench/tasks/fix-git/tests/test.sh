#!/bin/bash
# Verifier: master checked out, clean, holding the three lost commits and the typo fix, and
# each file byte for byte what keeping both sides gives (sha256). Writes 1 or 0.
mkdir -p /logs/verifier
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app/site || fail "no repository at /app/site"
[ "$(git symbolic-ref -q HEAD)" = refs/heads/master ] || fail "master is not checked out"
[ -z "$(git status --porcelain)" ] || fail "the working tree is not clean"
subjects=$(git log master --format=%s)
for s in "About: introduce the team" "New colour scheme" "Add a contact page" \
    "Fix a typo in the about heading"; do
    grep -qxF "$s" <<<"$subjects" || fail "commit '$s' is not on master"
done
while read -r want file; do
    got=$(git show "master:$file" 2>/dev/null | sha256sum | awk '{print $1}')
    [ "$got" = "$want" ] || fail "$file on master differs from the expected content"
done < /tests/expected.sha256
echo "PASS"
echo 1 > /logs/verifier/reward.txt
