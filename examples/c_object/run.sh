#!/usr/bin/env bash
# Builds and runs the build-time-object example for the host arch.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/../../target/c_object}"
mkdir -p "$out"
arch="$(uname -m)"
ftramp() { cargo run -q --manifest-path "$here/../../Cargo.toml" -p ftramp -- "$@"; }
ftramp gen --arch "$arch" -o "$out/tramp.o"
ftramp gen --arch "$arch" --header -o "$out/ftramp.h"
cc -O2 -fcf-protection=none $(ftramp cflags --arch "$arch") -c "$here/work.c" -o "$out/work.o"
cc -O2 -I "$out" -c "$here/main.c" -o "$out/main.o"
cc "$out/main.o" "$out/work.o" "$out/tramp.o" -o "$out/c_object"
"$out/c_object"
