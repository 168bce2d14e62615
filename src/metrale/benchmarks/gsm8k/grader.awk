# GSM8K grader without an interpreter start: answer.py's extract_answer, in POSIX awk.
#
#   LC_ALL=C awk -v ref=REFERENCE -f grader.awk completion.txt
#   LC_ALL=C awk -v ref=REFERENCE -v text_arg=1 -f grader.awk "$COMPLETION"
#   (metrale passes this program as awk's program argument, and the completion as the next
#   argument where it fits one and holds no NUL byte: no file per rollout)
#
# prints {"parsed": "N" or null, "reward": 1.0 or 0.0}, like `python3 grader.py`. Exit 3 means
# "not mine, ask grader.py": a byte outside ASCII (Python's \d, \w, \s and IGNORECASE are
# Unicode-wide there) or a fractional answer of more than 28 significant digits (Decimal's
# normalize() rounds those). On everything else it is answer.py's rules exactly, each regex
# replaced by the one path Python's backtracking can succeed on (see tests/benchmarks/
# test_gsm8k_grader.py, which checks it against extract_answer on the whole data set and on
# generated texts):
#   NUMBER  A: -? $? one-\s? digits (d{1,3}(,ddd)+ when the run is <= 3 long and one follows,
#              else all the digits), then .digits if there;  B: -? $? .digits
#   the last-number fallback takes A only where the character before is not [A-Za-z0-9_.].
BEGIN {
    WS = " \t\n\r\f\v\034\035\036\037"
    DIG = "0123456789"
    WORD = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_."
    hi = sprintf("%c", 128)
    bad = 0
    if (text_arg) {  # the text itself, read as a file would be: without its last newline
        T = ARGV[1]
        sub(/\n$/, "", T)
        bad = !ascii(T)
        exit
    }
}
{
    if (!bad) bad = !ascii($0)
    T = (NR == 1) ? $0 : T "\n" $0
}
function ascii(s,    k) {
    for (k = 1; k <= length(s); k++) if (substr(s, k, 1) >= hi) return 0
    return 1
}
function isws(c) { return c != "" && index(WS, c) > 0 }
function isdig(c) { return c != "" && index(DIG, c) > 0 }
function skipws(p) { while (p <= n && index(WS, substr(T, p, 1)) > 0) p++; return p }
function digits(p) { while (p <= n && index(DIG, substr(T, p, 1)) > 0) p++; return p }
function group(q) {
    return substr(T, q, 1) == "," && isdig(substr(T, q + 1, 1)) && isdig(substr(T, q + 2, 1)) \
        && isdig(substr(T, q + 3, 1))
}
function alt_a(i,    p, q) {
    p = i
    if (substr(T, p, 1) == "-") p++
    if (substr(T, p, 1) == "$") p++
    if (isws(substr(T, p, 1))) p++
    if (!isdig(substr(T, p, 1))) return 0
    q = digits(p)
    if (q - p <= 3 && group(q)) { while (group(q)) q += 4 }
    if (substr(T, q, 1) == "." && isdig(substr(T, q + 1, 1))) q = digits(q + 1)
    NE = q
    return 1
}
function alt_b(i,    p) {
    p = i
    if (substr(T, p, 1) == "-") p++
    if (substr(T, p, 1) == "$") p++
    if (substr(T, p, 1) != "." || !isdig(substr(T, p + 1, 1))) return 0
    NE = digits(p + 1)
    return 1
}
function num(p) {
    if (alt_a(p) || alt_b(p)) { LAST = substr(T, p, NE - p); FOUND = 1; return 1 }
    return 0
}
function marker_hash(    i, p) {
    for (i = 1; i <= n; ) {
        if (substr(T, i, 4) == "####" && num(skipws(i + 4))) { i = NE; continue }
        i++
    }
}
function marker_boxed(    i, p) {
    for (i = 1; i <= n; ) {
        if (substr(T, i, 7) == "\\boxed{") {
            p = skipws(i + 7)
            if (substr(T, p, 1) == "\\") p++
            if (substr(T, p, 1) == "$") p++
            if (num(skipws(p))) { i = NE; continue }
        }
        i++
    }
}
function marker_is(    i, p) {
    for (i = 1; i <= n; ) {
        if (tolower(substr(T, i, 6)) == "answer" && isws(substr(T, i + 6, 1))) {
            p = skipws(i + 6)
            if (tolower(substr(T, p, 2)) == "is") {
                p = skipws(p + 2)
                if (substr(T, p, 1) == ":") p++
                p = skipws(p)
                if (substr(T, p, 1) == "\\") p++
                if (substr(T, p, 1) == "$") p++
                while (substr(T, p, 1) == "*") p++
                if (num(skipws(p))) { i = NE; continue }
            }
        }
        i++
    }
}
function after_label(q) {
    q = skipws(q)
    if (substr(T, q, 1) != ":") return 0
    q = skipws(q + 1)
    while (substr(T, q, 1) == "*") q++
    return num(skipws(q))
}
function marker_line(    i, p, ok) {
    for (i = 1; i <= n; ) {
        if (i == 1 || substr(T, i - 1, 1) == "\n") {
            p = skipws(i)
            ok = 0
            if (tolower(substr(T, p, 1)) == "a") {
                ok = after_label(p + 1)
                if (!ok && tolower(substr(T, p, 6)) == "answer") ok = after_label(p + 6)
            }
            if (ok) { i = NE; continue }
        }
        i++
    }
}
function last_number(    i, prev, ok) {
    for (i = 1; i <= n; ) {
        prev = (i > 1) ? substr(T, i - 1, 1) : ""
        ok = 0
        if (prev == "" || index(WORD, prev) == 0) ok = alt_a(i)
        if (!ok) ok = alt_b(i)
        if (ok) { LAST = substr(T, i, NE - i); FOUND = 1; i = NE; continue }
        i++
    }
}
function normalize(s,    t, neg, ip, fp, dot, sig) {
    t = s
    gsub(/[,$ ]/, "", t)
    while (t != "" && isws(substr(t, 1, 1))) t = substr(t, 2)
    while (t != "" && isws(substr(t, length(t), 1))) t = substr(t, 1, length(t) - 1)
    if (t !~ /^-?([0-9]+(\.[0-9]+)?|\.[0-9]+)$/) return ""
    neg = substr(t, 1, 1) == "-"
    if (neg) t = substr(t, 2)
    dot = index(t, ".")
    ip = dot ? substr(t, 1, dot - 1) : t
    fp = dot ? substr(t, dot + 1) : ""
    sub(/^0+/, "", ip)
    sub(/0+$/, "", fp)
    if (fp == "") return (ip == "") ? "0" : ((neg ? "-" : "") ip)
    sig = ip fp
    sub(/^0+/, "", sig)
    if (length(sig) > 28) exit 3
    return (neg ? "-" : "") (ip == "" ? "0" : ip) "." fp
}
END {
    if (bad) exit 3
    n = length(T)
    FOUND = 0
    parsed = ""
    if (n > 0) {
        marker_hash()
        if (!FOUND) marker_boxed()
        if (!FOUND) marker_is()
        if (!FOUND) marker_line()
        if (!FOUND) last_number()
        if (FOUND) parsed = normalize(LAST)
    }
    if (parsed == "") printf "{\"parsed\": null, \"reward\": 0.0}\n"
    else printf "{\"parsed\": \"%s\", \"reward\": %s}\n", parsed, (parsed == ref) ? "1.0" : "0.0"
}
