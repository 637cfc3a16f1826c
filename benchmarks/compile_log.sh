#!/usr/bin/env bash
# Where a run's C++ compiles go: runs COMMAND with a g++ on the PATH (and as $CXX, which Inductor reads) that
# logs each call's seconds, its -O level, its output file and $PYTEST_CURRENT_TEST, then calls the real
# one; prints the seconds and calls per test. Used for the suite's figures in docs/benchmarks.md ("The test
# suite on another CPU": 87 calls, 75.7 s in a cold run of the whole suite, 2026-11-30).
#
#     bash benchmarks/compile_log.sh LOG -- python -m pytest -q -n 2 --dist loadfile -p no:cacheprovider
set -euo pipefail
LOG=$(realpath "$1")
shift
[ "${1:-}" = "--" ] && shift
REAL=$(command -v "${CXX:-g++}")
WRAP=$(mktemp -d)
cat >"$WRAP/g++" <<WRAPPER
#!/usr/bin/env bash
start=\$(date +%s.%N)
"$REAL" "\$@"
rc=\$?
end=\$(date +%s.%N)
level=\$(printf '%s\n' "\$@" | grep -m1 -E '^-O[0-3s]$' || true)
out=\$(printf '%s\n' "\$@" | grep -A1 -x -- '-o' | tail -n1 || true)
echo "\$(python3 -c "print(round(\$end - \$start, 3))")|\$level|\${out##*/}|\${PYTEST_CURRENT_TEST:-}" >>"$LOG"
exit \$rc
WRAPPER
chmod +x "$WRAP/g++"
: >"$LOG"
PATH="$WRAP:$PATH" CXX="$WRAP/g++" "$@" || echo "(the command exited $?)"
python3 - "$LOG" <<'SUMMARY'
import collections, sys
seconds, calls = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    t, _, _, test = line.rstrip("\n").split("|", 3)
    test = test.rsplit(" (", 1)[0] or "(outside a test)"
    seconds[test] += float(t)
    calls[test] += 1
print(f"g++: {sum(calls.values())} calls, {sum(seconds.values()):.1f} s")
for test, s in seconds.most_common(20):
    print(f"{s:7.1f} s {calls[test]:4d}  {test}")
SUMMARY
rm -rf "$WRAP"
