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

# An unknown enum value of 4000 characters is cut in the message (item 15): the line stays
# under 500 characters, the allowed kinds (16 since record_stream) included.
long=$(head -c 4000 /dev/zero | tr '\0' x)
sed "0,/\"kind\": \"kernel\"/s//\"kind\": \"$long\"/" tests/data/schedule/host-event-sync.json \
  >"$dir/kind.json"
out=$("$hpzlab" check --schedule "$dir/kind.json" 2>&1)
rc=$?
[ $rc = 2 ] && [ ${#out} -lt 500 ] && case "$out" in *"(4000 bytes)"*) true ;; *) false ;; esac ||
  fail "long kind: exit $rc, ${#out} characters"

# The sweep's files (issue 34, items 1 and 7): a child's JSON nested 100,000 deep segfaulted
# --collect; a child's .err linked to /dev/zero was read whole. Now: a failed row that says why,
# and one line naming the .err (anything in DIR/out that is not a regular file: exit 2).
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=1,2 --variants stock --emit "$dir/sw" >/dev/null 2>&1 ||
  fail "sweep --emit: exit $?"
python3 -c "print('[' * 100000 + ']' * 100000)" >"$dir/sw/out/p0-v0.json"
out=$(timeout 60 "$hpzlab" sweep --collect "$dir/sw" 2>&1)
rc=$?
[ $rc = 1 ] || fail "sweep --collect on a deep child's JSON: exit $rc (1: a failed row), '$out'"
grep -q "p0-v0.json: not JSON: nested more than 64 levels deep" "$dir/sw/results.csv" ||
  fail "sweep --collect: no failed row for the deep JSON"
ln -s /dev/zero "$dir/sw/out/p1-v0.err"
out=$(timeout 60 "$hpzlab" sweep --collect "$dir/sw" 2>&1)
rc=$?
[ $rc = 2 ] && [ "$out" = "hpzlab: error: $dir/sw/out/p1-v0.err: cannot read a command's error output: is not a regular file (a device, FIFO or socket is not read) (allowed: the regular file the command wrote there, or nothing)" ] ||
  fail "sweep --collect on a .err linked to /dev/zero: exit $rc, '$out'"

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
# As soon as the first holds the lock (a fixed sleep let a fast build finish first).
tries=0
while [ ! -e "$dir/locked/sweep.lock" ] && [ $tries -lt 200 ]; do
  sleep 0.05
  tries=$((tries + 1))
done
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

# The fields of the sweep's files (issue 34, item 8): a wrong type, a null count, a missing key,
# a directory or a link loop in DIR/out were "internal error", exit 70; a byte that is not UTF-8
# in a child's standard error too. Now one line naming the file, the key and what was expected,
# exit 2; the stray byte becomes U+FFFD in the failed row.
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=1 --variants stock --emit "$dir/ft" >/dev/null 2>&1 ||
  fail "field types: --emit: exit $?"
HPZLAB=$hpzlab sh "$dir/ft/commands.txt" || fail "field types: the emitted command: exit $?"
# collect_case NAME EXIT MESSAGE: --collect on a copy of $dir/ft that the function mutate changed.
collect_case() {
  rm -rf "$dir/fc" && cp -R "$dir/ft" "$dir/fc" && mutate "$dir/fc"
  out=$(timeout 60 "$hpzlab" sweep --collect "$dir/fc" 2>&1 >/dev/null)
  rc=$?
  [ $rc = "$2" ] && [ "$out" = "$3" ] || fail "$1: exit $rc, '$out'"
}
# edit FILE SED-SCRIPT
edit() {
  sed "$2" "$1" >"$1.edited" && mv "$1.edited" "$1"
}
mutate() { edit "$1/out/p0-v0.json" 's/"hung": false/"hung": 1/'; }
collect_case '"hung": 1' 2 "hpzlab: error: $dir/fc/out/p0-v0.json: runs[0].hung: expected true or false, got 1"
mutate() { edit "$1/out/p0-v0.json" 's/"races_manifested": [0-9]*/"races_manifested": null/'; }
collect_case 'a null count' 2 "hpzlab: error: $dir/fc/out/p0-v0.json: runs[0].races_manifested: expected a whole number, 0 or more, got null"
mutate() { edit "$1/out/p0-v0.json" 's/"step_time_s"/"step_time"/'; }
collect_case 'no step_time_s' 2 "hpzlab: error: $dir/fc/out/p0-v0.json: runs[0].step_time_s: missing (expected a number or null)"
mutate() { rm "$1/out/p0-v0.json" && mkdir "$1/out/p0-v0.json"; }
collect_case 'a directory in out/' 2 "hpzlab: error: $dir/fc/out/p0-v0.json: cannot read a command's JSON: is a directory, not a file (allowed: the regular file the command wrote there, or nothing)"
mutate() { rm "$1/out/p0-v0.err" && ln -s p0-v0.err "$1/out/p0-v0.err"; }
collect_case 'a link loop in out/' 2 "hpzlab: error: $dir/fc/out/p0-v0.err: cannot read a command's error output: Too many levels of symbolic links (allowed: the regular file the command wrote there, or nothing)"
mutate() { rm "$1/out/p0-v0.json" && printf 'hpzlab: error: bad \377 byte\n' >"$1/out/p0-v0.err"; }
collect_case 'a byte that is not UTF-8' 1 ""
python3 -c "import json,sys; r=json.loads(open(sys.argv[1], encoding='utf-8').readline()); sys.exit(r['error'] != 'bad \ufffd byte')" \
  "$dir/fc/results.jsonl" || fail "a byte that is not UTF-8: not U+FFFD in the failed row"

# DIR/sweep.json held to the command line's limits (issue 34, item 9): "runs": 2000000000 built
# 2e9 rows, six axes of 100 values looped for hours, "runs": -5 exited 0 with an empty table.
mutate() { edit "$1/sweep.json" 's/"runs": 1,/"runs": 2000000000,/'; }
collect_case '"runs": 2000000000' 2 "hpzlab: error: $dir/fc/sweep.json: runs: expected a whole number from 1 to 10000, got 2000000000"
mutate() { edit "$1/sweep.json" 's/"runs": 1,/"runs": -5,/'; }
collect_case '"runs": -5' 2 "hpzlab: error: $dir/fc/sweep.json: runs: expected a whole number from 1 to 10000, got -5"
mutate() {
  python3 -c "import json,sys; p=sys.argv[1]; j=json.load(open(p)); j['vary']=[{'key':'a.k%d' % i,'values':[str(v) for v in range(100)]} for i in range(6)]; json.dump(j, open(p, 'w'))" "$1/sweep.json"
}
collect_case 'six axes of 100 values' 2 "hpzlab: error: $dir/fc/sweep.json: vary: 1000000000000 simulations (allowed: at most 10000000)"
mutate() { edit "$1/sweep.json" 's/"stock"/5/'; }
collect_case 'a variant that is a number' 2 "hpzlab: error: $dir/fc/sweep.json: variants[0]: expected stock, host-sync, event-wait or no-hpz, got 5"

# --resume reads results.jsonl field by field (issue 34, item 8): "status": 5 was "internal
# error" after every missing simulation had run; now one line (no progress line: none ran).
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=1,2 --out "$dir/rs" >/dev/null 2>&1 || fail "resume: the sweep: exit $?"
edit "$dir/rs/results.jsonl" '1s/"status":"ok"/"status":5/; 2d'
out=$("$hpzlab" sweep $scenario --vary cluster.nic_gbps=1,2 --out "$dir/rs" --resume 2>&1)
rc=$?
[ $rc = 2 ] && [ "$out" = "hpzlab: error: $dir/rs/results.jsonl:1: status: expected ok, hung or failed, got 5" ] ||
  fail "--resume with \"status\": 5: exit $rc, '$out'"

# Validation that would take minutes (issue 34, item 13): refused once 100,000 combinations of the
# other axes have been tried for the values the scenario refuses alone.
out=$(timeout 300 "$hpzlab" sweep $scenario --vary zero.zero_hpz_partition_size=1402:2000:2 \
  --vary cluster.gpus_per_node=1:1000:1 --emit "$dir/slow" 2>&1)
rc=$?
[ $rc = 2 ] && case "$out" in *"validation stopped after trying 100000 combinations"*) true ;; *) false ;; esac ||
  fail "slow validation: exit $rc, '$out'"
# A killed --emit (before sweep.json) left a directory the rerun refused; now it starts over.
mkdir -p "$dir/ie/out" && echo partial >"$dir/ie/commands.txt.tmp"
"$hpzlab" sweep $scenario --vary cluster.nic_gbps=1 --emit "$dir/ie" >/dev/null 2>&1 || fail "interrupted --emit: exit $?"
[ "$(wc -l <"$dir/ie/commands.txt")" = 1 ] && [ ! -e "$dir/ie/commands.txt.tmp" ] && [ -f "$dir/ie/sweep.json" ] ||
  fail "interrupted --emit: not written over"

[ $failed = 0 ] && echo "hostile input: all cases pass"
exit $failed
