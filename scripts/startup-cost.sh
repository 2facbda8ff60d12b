#!/bin/sh
# What a traced process costs at start, best and median of N interleaved
# runs of a one-call C program with patch sites: untraced, recorded as
# `ftramp record` runs it (recorder preloaded, the audit module, the clock
# calibration handed over), and recorded without the audit module.
#   scripts/startup-cost.sh [N] [DIR]   (DIR: where the recorder and the
#   audit module are; default target/release/deps, built by
#   `cargo build --release -p ftramp`)
set -eu
n=${1:-200}
dir=$(cd "${2:-target/release/deps}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here=$(dirname "$0")
cc -O2 -o "$work/startup-cost" "$here/startup-cost.c"
printf '__attribute__((noinline)) int one(int x) { return x + 1; }\nint main(void) { return one(-1); }\n' > "$work/one.c"
cc -O2 -fpatchable-function-entry=5 -fno-ipa-ra -o "$work/one" "$work/one.c"
mkdir "$work/trace"
printf 'version = 2\ntracer = "function_graph"\n' > "$work/trace/info"
clock=$("$dir/../ftramp" record -d "$work/clock" -- /usr/bin/env 2>/dev/null | sed -n 's/^FTRAMP_CLOCK=//p')
rec="LD_PRELOAD=$dir/libftramp_recorder.so,FTRAMP_RECORD_DIR=$work/trace,FTRAMP_CLOCK=$clock"
"$work/startup-cost" "$n" - "$rec,LD_AUDIT=$dir/libftramp_audit.so" "$rec" -- "$work/one"
