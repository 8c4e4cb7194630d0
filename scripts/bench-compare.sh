#!/usr/bin/env bash
# Two builds of slipstream, measured alternately in one run: did a change
# make the data path slower? (docs/testing.md, "Comparing two builds").
#
#   scripts/bench-compare.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# Each round runs `slipstream bench` once with each binary (old first on
# odd rounds, new first on even ones, so neither always meets the machine
# warmer), on the node proxy's and the waypoint's scenarios (l4-ebpf, l7)
# and the request experiments (Q1, L1, C1), one repetition each. Every
# figure is read against `none` of the same bench run, so a drift of the
# machine between runs cancels out: rates as their ratio to none,
# latencies as the milliseconds the mesh adds over none. Prints, per
# scenario and figure, each binary's median, its spread (max - min over
# the rounds) and the change (relative to the old median: for latencies,
# to the time the mesh added), and says whether the change is within 3 %
# or within the old binary's own spread, whichever is larger (issue 38's
# bound).
#
# Needs root, like `slipstream bench`. ROUNDS defaults to 5. Output goes
# to bench-out/compare-<UTC time>/ (OUT= to choose).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  echo "usage: $0 OLD_BINARY NEW_BINARY [ROUNDS]" >&2
  exit 2
fi
old=$(readlink -f "$1")
new=$(readlink -f "$2")
rounds=${3:-5}
for b in "$old" "$new"; do
  [ -x "$b" ] || { echo "bench-compare: $b is not an executable" >&2; exit 2; }
done
[ "$(id -u)" -eq 0 ] || { echo "bench-compare: needs root (slipstream bench builds a cluster)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench-compare: needs python3 to summarise" >&2; exit 2; }
out=${OUT:-bench-out/compare-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
echo "bench-compare: old=$old new=$new rounds=$rounds -> $out"

run() { # label binary round
  echo "== round $3: $1"
  "$2" bench --scenarios l4-ebpf,l7 --experiments Q1,L1,C1 --reps 1 --out "$out/$1-$3" >"$out/$1-$3.log" 2>&1 || {
    echo "bench-compare: the $1 run of round $3 failed; see $out/$1-$3.log" >&2
    tail -n 20 "$out/$1-$3.log" >&2
    exit 1
  }
}
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then run old "$old" "$i"; run new "$new" "$i"; else run new "$new" "$i"; run old "$old" "$i"; fi
done

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
# figure -> whether higher is better
figures = {"Q1": {"rps": True, "p50_ms": False, "p99_ms": False}, "L1": {"p50_ms": False, "p99_ms": False}, "C1": {"cps": True}}
def ratios(label, i):
    runs = json.load(open(f"{out}/{label}-{i}/results.json"))["runs"]
    base = {(r["experiment"], k): v for r in runs if r["scenario"] == "none" and not r.get("error") for k, v in r["figures"].items()}
    got = {}
    for r in runs:
        if r["scenario"] == "none" or r.get("error"):
            continue
        for k, v in r["figures"].items():
            b = base.get((r["experiment"], k))
            if k in figures.get(r["experiment"], {}) and b:
                # Latency: the mesh's added time over none (ms); rates: the ratio.
                got[(r["scenario"], r["experiment"], k)] = v / b if figures[r["experiment"]][k] else v - b
    return got
data = {l: [ratios(l, i) for i in range(1, rounds + 1)] for l in ("old", "new")}
keys = sorted(set().union(*[d.keys() for d in data["old"]]))
bad = 0
print(f"\n{'scenario':9} {'figure':10} {'old median':>11} {'spread':>8} {'new median':>11} {'spread':>8} {'change':>8}  verdict")
for key in keys:
    o = [d[key] for d in data["old"] if key in d]
    n = [d[key] for d in data["new"] if key in d]
    if not o or not n:
        continue
    mo, mn = statistics.median(o), statistics.median(n)
    so, sn = max(o) - min(o), max(n) - min(n)
    higher = figures[key[1]][key[2]]
    # Worse is lower for rates, higher for added latency.
    worse = (mo - mn) if higher else (mn - mo)
    change = (mn - mo) / abs(mo) * 100 if mo else 0.0
    ok = worse <= max(0.03 * abs(mo), so)
    bad += not ok
    unit = "x none" if higher else "ms added"
    print(f"{key[0]:9} {key[1]+' '+key[2]:10} {mo:11.3f} {so:8.3f} {mn:11.3f} {sn:8.3f} {change:+7.1f}%  {'ok' if ok else 'SLOWER'} ({unit})")
print(f"\n{'every figure within 3 % or the old binary’s spread' if not bad else str(bad) + ' figure(s) slower than 3 % and the old spread'}")
sys.exit(1 if bad else 0)
EOF
