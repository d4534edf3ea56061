#!/usr/bin/env bash
# scripts/reproduce.sh: bad input is one line and exit 2; a dirty build's results never reach reports/ (exit 3, the
# set left under results/reproduce/); a clean build's set and the device index are written.
# Usage: tests/reproduce_test.sh PROJECT_ROOT
set -u
cd "$1" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
one_line_exit_2() {
  local out rc
  out=$("$@" 2>&1); rc=$?
  [ $rc = 2 ] || fail "$*: exit $rc, expected 2: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "$*: not one line: $out"
}
one_line_exit_2 scripts/reproduce.sh nosuch-topic
one_line_exit_2 scripts/reproduce.sh
one_line_exit_2 scripts/reproduce.sh --device 'Bad Name' mla-cpu
one_line_exit_2 scripts/reproduce.sh --bogus mla-cpu
one_line_exit_2 python3 scripts/reports_index.py --checkpoint nosuch-topic
# A topic on real weights names a model config that exists; the others name none.
config=$(python3 scripts/reports_index.py --checkpoint layer-decode-peers)
[ -f "$config" ] || fail "layer-decode-peers: checkpoint config '$config' is not a file"
[ -z "$(python3 scripts/reports_index.py --checkpoint mla-cpu)" ] || fail "mla-cpu: names a checkpoint"

# A stand-in dslab (version SHA given by FAKE_SHA): its run writes a one-entry results file, its report a report.md.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" reports/test-reproduce-dirty reports/test-reproduce-clean results/reproduce/test-reproduce-*' EXIT
cat >"$tmp/dslab" <<'FAKE'
#!/usr/bin/env bash
case $1 in
  --version) echo "dslab 0.1.0 ($FAKE_SHA)" ;;
  run) while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
       mkdir -p "$out"
       printf '{"context": {"git_sha": "%s"}, "benchmarks": [{"name": "mla/cc/cpu/x", "variant": "mla/cc/cpu", "axes": {"batch": 1}, "real_time": 30, "run_type": "iteration"}, {"name": "mla/a_cc_me/cpu/x", "variant": "mla/a_cc_me/cpu", "axes": {"batch": 1}, "real_time": 10, "run_type": "iteration"}]}' "$FAKE_SHA" >"$out/results.json" ;;
  report) while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
          echo "# report" >"$out/report.md" ;;
esac
FAKE
chmod +x "$tmp/dslab"
FAKE_SHA=0123456789ab-dirty DSLAB=$tmp/dslab scripts/reproduce.sh --device test-reproduce-dirty mla-cpu >/dev/null 2>&1
rc=$?
[ $rc = 3 ] || fail "dirty build: exit $rc, expected 3"
[ ! -e reports/test-reproduce-dirty ] || fail "dirty build: wrote reports/test-reproduce-dirty"
[ -f results/reproduce/test-reproduce-dirty/mla-cpu/results.json ] || fail "dirty build: its results are not kept"
FAKE_SHA=0123456789ab DSLAB=$tmp/dslab scripts/reproduce.sh --device test-reproduce-clean mla-cpu >/dev/null 2>&1 ||
  fail "clean build: exit $?"
[ -f reports/test-reproduce-clean/mla-cpu/results.json ] || fail "clean build: no set written"
grep -q '| mla-cpu | cc / a_cc_me time, DeepSeek-V2 decode on the CPU | 3.00 | 1 points | 0123456789ab |' \
  reports/test-reproduce-clean/README.md || fail "clean build: index line: $(grep mla-cpu reports/test-reproduce-clean/README.md)"
echo "reproduce.sh: bad input, dirty refusal, clean set and index line: ok"
