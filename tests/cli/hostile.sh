#!/bin/bash
# Hostile input the one-line cases of tests/cli/*.txt cannot express (issue 20):
# `tests/cli/hostile.sh HPZLAB`, run from the repository root.
# Output paths (items 1 and 14): a symlink is written through (its target replaced, the link
# kept), a FIFO is written into (never replaced by a file), a directory at PATH.tmp does not stop
# the write, and a run whose later output cannot be written writes none of its outputs.
# Empty arguments (item 15): '' for a numeric flag is refused, not read as "not given"; issue 34:
# '' for an output, schedule steps out of order, long enum values cut, the sweep's files read
# through the guarded reader.
set -u
hpzlab=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/hpzlab-hostile.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
scenario=scenarios/tiny.toml

# A symlink: the link stays, its target gets the JSON.
echo old >"$dir/target.json"
ln -s target.json "$dir/link.json"
"$hpzlab" schedule $scenario --json "$dir/link.json" >/dev/null || fail "symlink: exit $?"
[ -L "$dir/link.json" ] || fail "symlink: the link was replaced"
grep -q '"format":"hpzlab-schedule"' "$dir/target.json" || fail "symlink: the target is not written"

# A FIFO: its reader gets the JSON, the FIFO stays a FIFO.
mkfifo "$dir/fifo.json"
timeout 60 cat "$dir/fifo.json" >"$dir/from-fifo" &
reader=$!
"$hpzlab" schedule $scenario --json "$dir/fifo.json" >/dev/null || fail "fifo: exit $?"
wait $reader
[ -p "$dir/fifo.json" ] || fail "fifo: replaced by a file"
grep -q '"format":"hpzlab-schedule"' "$dir/from-fifo" || fail "fifo: the reader got nothing"

# PATH.tmp is a directory: the write goes through another temporary name.
mkdir "$dir/out.json.tmp"
"$hpzlab" schedule $scenario --json "$dir/out.json" >/dev/null || fail "out.json.tmp dir: exit $?"
grep -q '"format":"hpzlab-schedule"' "$dir/out.json" || fail "out.json.tmp dir: not written"
[ "$(ls "$dir" | grep -c '\.tmp$')" = 1 ] || fail "out.json.tmp dir: a temporary file was left"

# A later output that cannot be written: nothing is written, exit 2, its own flag named.
out=$("$hpzlab" sim $scenario --set run.steps=1 --json "$dir/sim.json" --trace "$dir/no/t.json" 2>&1)
rc=$?
[ $rc = 2 ] || fail "unwritable --trace: exit $rc"
[ -e "$dir/sim.json" ] && fail "unwritable --trace: --json was written anyway"
[ "$out" = "hpzlab: error: $dir/no/t.json: --trace: cannot write this file" ] ||
  fail "unwritable --trace: message '$out'"

# The same file through a symlink is still the same file.
out=$("$hpzlab" sim $scenario --json "$dir/target.json" --trace "$dir/link.json" 2>&1)
[ $? = 2 ] || fail "the same file twice: not refused"
case "$out" in *"--trace: is also given to --json"*) ;; *) fail "the same file twice: '$out'" ;; esac

# An empty value for a flag that takes a number.
out=$("$hpzlab" schedule $scenario --rank '' 2>&1)
[ $? = 2 ] && [ "$out" = "hpzlab: error: --rank: expected a value, got ''" ] ||
  fail "--rank '': '$out'"
out=$("$hpzlab" repro $scenario --steps '' 2>&1)
[ $? = 2 ] && [ "$out" = "hpzlab: error: --steps: expected a value, got ''" ] ||
  fail "--steps '': '$out'"

# An empty output value (issue 34, item 12): refused, not "no output".
out=$("$hpzlab" check $scenario --json '' 2>&1)
[ $? = 2 ] && [ "$out" = "hpzlab: error: --json: expected a value, got ''" ] ||
  fail "--json '': '$out'"

# A schedule whose steps do not run in order (issue 34, item 11): 2147483647 overflowed the
# step count and killed the simulation child; -5 and a jump were accepted.
for step in 2147483647 -5 7; do
  sed "0,/\"step\": 0/s//\"step\": $step/" tests/data/schedule/host-event-sync.json >"$dir/step.json"
  out=$("$hpzlab" check --schedule "$dir/step.json" 2>&1)
  rc=$?
  case "$out" in
    *"ranks[0].ops[0].step: $step as the first op: a rank's steps come one after another"*) ;;
    *) fail "step $step: exit $rc, '$out'" ;;
  esac
  [ $rc = 2 ] || fail "step $step: exit $rc"
done

# An unknown enum value of 4000 characters is cut in the message (item 15).
long=$(head -c 4000 /dev/zero | tr '\0' x)
sed "0,/\"kind\": \"kernel\"/s//\"kind\": \"$long\"/" tests/data/schedule/host-event-sync.json \
  >"$dir/kind.json"
out=$("$hpzlab" check --schedule "$dir/kind.json" 2>&1)
rc=$?
[ $rc = 2 ] && [ ${#out} -lt 400 ] && case "$out" in *"(4000 bytes)"*) true ;; *) false ;; esac ||
  fail "long kind: exit $rc, ${#out} characters"

# The sweep's files (issue 34, items 1 and 7): a child's JSON nested 100,000 deep segfaulted
# --collect; a child's .err linked to /dev/zero was read whole. Now: not run yet, and a failed
# row that says why.
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=1,2 --variants stock --emit "$dir/sw" >/dev/null 2>&1 ||
  fail "sweep --emit: exit $?"
python3 -c "print('[' * 100000 + ']' * 100000)" >"$dir/sw/out/p0-v0.json"
ln -s /dev/zero "$dir/sw/out/p1-v0.err"
out=$(timeout 60 "$hpzlab" sweep --collect "$dir/sw" 2>&1)
rc=$?
[ $rc = 1 ] || fail "sweep --collect on hostile children's files: exit $rc (1: a failed row), '$out'"
grep -q "p1-v0.err: cannot read the child's error output: is not a regular file" "$dir/sw/results.csv" ||
  fail "sweep --collect: no failed row for the /dev/zero .err"

# A FIFO output nobody reads (issue 34, item 10): blocked forever; now one line after 10 s.
mkfifo "$dir/lonely.fifo"
out=$(timeout 60 "$hpzlab" schedule $scenario --json "$dir/lonely.fifo" 2>&1)
rc=$?
[ $rc = 2 ] && case "$out" in *"--json: cannot write this file: a FIFO that no process read from in 10 s"*) true ;; *) false ;; esac ||
  fail "FIFO without a reader: exit $rc, '$out'"

# Two sweeps in one directory (issue 34, item 3): the second is refused while the first runs.
points=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=$points --runs 2 --out "$dir/locked" >/dev/null 2>&1 &
first=$!
sleep 2
out=$("$hpzlab" sweep $scenario --vary cluster.nic_gbps=$points --runs 2 --out "$dir/locked" --resume 2>&1)
rc=$?
wait $first || fail "the first sweep: exit $?"
[ $rc = 2 ] && case "$out" in *"--resume: another hpzlab sweep is working in this directory"*) true ;; *) false ;; esac ||
  fail "a second sweep in a locked directory: exit $rc, '$out'"

# A link planted at the sweep table's temporary name (issue 34, item 2): its target is left
# alone (it was truncated and overwritten).
echo precious >"$dir/precious"
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=1 --out "$dir/planted" >/dev/null 2>&1 ||
  fail "planted link: the first sweep: exit $?"
ln -s "$dir/precious" "$dir/planted/results.csv.tmp"
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=1 --out "$dir/planted" --resume >/dev/null 2>&1 ||
  fail "planted link: --resume: exit $?"
[ "$(cat "$dir/precious")" = precious ] || fail "planted link: its target was overwritten"
grep -q '^point,variant,run' "$dir/planted/results.csv" || fail "planted link: no table written"

[ $failed = 0 ] && echo "hostile input: all cases pass"
exit $failed
