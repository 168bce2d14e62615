#!/bin/bash
# The oracle: one pass of awk over the lines that have the combined log format's shape.
set -euo pipefail
cd /app
awk '
match($0, /^[0-9.]+ [^ ]+ [^ ]+ \[[0-9][0-9]\/[A-Za-z]+\/[0-9]+:[0-9][0-9]:[0-9][0-9]:[0-9][0-9] [+-][0-9]+\] "[A-Z]+ [^ "]+ [^"]+" [0-9][0-9][0-9] ([0-9]+|-)/) {
    n++
    ip[$1] = 1
    split($4, t, ":"); hour[t[2]]++
    path = $7; sub(/\?.*/, "", path); paths[path]++
    status = $9; class[substr(status, 1, 1)]++
    if ($10 != "-") bytes += $10
}
END {
    printf "requests: %d\nunique_ips: %d\n", n, length(ip)
    for (c = 2; c <= 5; c++) printf "status_%dxx: %d\n", c, class[c] + 0
    printf "bytes_total: %d\ntop_paths:\n", bytes
    for (p in paths) print paths[p], p | "sort -k1,1nr -k2,2 | sed -n \"1,3s/^/  /p\" > /tmp/top"
    close("sort -k1,1nr -k2,2 | sed -n \"1,3s/^/  /p\" > /tmp/top")
    while ((getline line < "/tmp/top") > 0) print line
    best = -1
    for (h = 0; h < 24; h++) { k = sprintf("%02d", h); if (hour[k] > best) { best = hour[k]; bh = k } }
    printf "busiest_hour: %s\n", bh
}' logs/access.log > report.txt
cat report.txt
