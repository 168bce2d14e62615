#!/bin/bash
# The oracle: find the detached commits through the reflog, merge them, resolve about.html by
# keeping both sides' changes, commit.
set -euo pipefail
cd /app/site
# awk reads the whole reflog (an early exit, as grep -m1's, would SIGPIPE git under pipefail)
lost=$(git reflog --format=%gs | awk '!found && /^checkout: moving from [0-9a-f]+ to master$/ {print $4; found = 1}')
[ -n "$lost" ] || { echo "no detached HEAD found in the reflog" >&2; exit 1; }
if git merge --no-edit "$lost"; then
    echo "merged without conflict"
else
    cat > about.html <<'HTML'
<!DOCTYPE html>
<html>
<head><title>About</title><link rel="stylesheet" href="css/style.css"></head>
<body>
<h1>About us</h1>
<p>We are a bakery of three: Ana bakes, Bo sells, Cy delivers.</p>
<p>Open Tuesday to Sunday.</p>
</body>
</html>
HTML
    git add about.html
    git commit -q --no-edit
fi
git log --oneline -n 8
