#!/bin/bash
# Runs every Go fuzz target for DURATION each (default 60s), one after the other: `go test
# -fuzz` takes one package and one target at a time. Reports per target the committed corpus
# (testdata/fuzz/FuzzXxx: seeds and the regression inputs of fixed findings), the corpus the
# run worked with (those, plus what earlier runs found, kept in the Go build cache, plus what
# this run found) and the executions.
#   scripts/fuzz.sh          # 60s per target
#   scripts/fuzz.sh 10m      # longer; FUZZ_PARALLEL=N workers per target (default 1)
# A failing target prints its log and the input go wrote to the package's testdata/fuzz/FuzzXxx/:
# fix the bug and commit that file with the fix, as a regression input. docs/reliability.md
# lists the targets, what they check, and what they found.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DURATION=${1:-60s}
TARGETS=(
	"./internal/config FuzzParse"
	"./internal/lb FuzzDecodeService"
	"./internal/lb FuzzAPI"
	"./internal/nftjson FuzzParse"
	"./internal/conntrack FuzzParseFlow"
	"./internal/k8s FuzzDerive"
	"./internal/model FuzzFastJSON"
	"./internal/tc FuzzProgram"
)
failed=0
printf "%-20s %-18s %9s %7s %10s  %s\n" package target committed corpus execs result
for t in "${TARGETS[@]}"; do
	read -r pkg fn <<<"$t"
	committed=$(find "$pkg/testdata/fuzz/$fn" -type f 2>/dev/null | wc -l)
	log=$(mktemp)
	# -fuzzminimizetime: minimizing each new input for the default 60 s would take most of a
	# short run (its executions are not counted); 2 s keeps the time for exploring.
	if go test -run='^$' -fuzz="^$fn\$" -fuzztime="$DURATION" -fuzzminimizetime=2s \
		-parallel "${FUZZ_PARALLEL:-1}" "$pkg" >"$log" 2>&1; then
		result=ok
	elif grep -q 'context deadline exceeded' "$log" && ! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$log" &&
		go test -count=1 -run="^$fn\$" "$pkg" >>"$log" 2>&1; then
		# Go < 1.27's fuzz coordinator can report its own -fuzztime deadline as a failure of the
		# target (go.dev/issue/75804: a worker busy at the deadline on a loaded machine), with no
		# input written. A real finding always writes its input; without one, and with the whole
		# corpus replayed cleanly, the run found nothing.
		result="ok, the Go deadline race (go.dev/issue/75804) at the end, corpus replayed clean"
	else
		result=FAIL failed=1
	fi
	last=$(grep -E '^fuzz: elapsed: .*execs: ' "$log" | tail -1)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
	corpus=$(sed -nE 's/.*\(total: ([0-9]+)\).*/\1/p' <<<"$last")
	printf "%-20s %-18s %9s %7s %10s  %s (%s)\n" "${pkg#./}" "$fn" "$committed" "${corpus:--}" "${execs:--}" "$result" "$DURATION"
	[ "${result%%,*}" = ok ] || sed 's/^/    /' "$log" >&2
	rm -f "$log"
done
exit $failed
