#!/usr/bin/env bash
# The README's test command: installs what the tests need when it is
# missing, then runs every test — native, and cross-built under qemu-user
# for each architecture with a backend.
#
#   scripts/test.sh            # everything
#   scripts/test.sh --native   # only the host's tests (no cross builds)
#
# With CI=true a tool that cannot be installed is a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

native_only=0
[[ "${1:-}" == "--native" ]] && native_only=1

log() { printf '\n== %s\n' "$*" >&2; }

# Debian packages: qemu-user and a cross gcc (which brings its binutils)
# per foreign arch; the host's binutils provide x86_64 objdump.
need_pkgs=()
command -v qemu-aarch64 >/dev/null || need_pkgs+=(qemu-user)
for triple in aarch64-linux-gnu riscv64-linux-gnu powerpc64le-linux-gnu s390x-linux-gnu; do
    command -v "$triple-gcc" >/dev/null || need_pkgs+=("gcc-$triple")
done
# C++ tracees (exectest/tests/unwind.rs) on the host and aarch64.
command -v aarch64-linux-gnu-g++ >/dev/null || need_pkgs+=(g++-aarch64-linux-gnu)
command -v g++ >/dev/null || need_pkgs+=(g++)
command -v objdump >/dev/null || need_pkgs+=(binutils)
# The tools the comparison tests run beside ftramp on the host (they skip
# with a message when one is missing; here CI gets them all): clang-14 with
# its XRay runtime (clang-built sites, XRay baselines) and uftrace.
if [[ "$(uname -m)" == x86_64 ]]; then
    command -v clang-14 >/dev/null || need_pkgs+=(clang-14)
    dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need_pkgs+=(libclang-rt-14-dev)
    command -v uftrace >/dev/null || need_pkgs+=(uftrace)
    # Boost.Context fibers (cli/tests/build_flags.rs: its stack switches).
    dpkg -s libboost-context-dev >/dev/null 2>&1 || need_pkgs+=(libboost-context-dev)
fi
command -v cc >/dev/null || need_pkgs+=(gcc)
if ((${#need_pkgs[@]})); then
    log "installing ${need_pkgs[*]}"
    if [[ $(id -u) -eq 0 ]]; then sudo=""; else sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need_pkgs[@]}" >/dev/null \
        || { echo "error: could not install ${need_pkgs[*]}" >&2; exit 1; }
fi

targets=(aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu powerpc64le-unknown-linux-gnu s390x-unknown-linux-gnu)
if ((native_only == 0)); then
    installed=$(rustup target list --installed 2>/dev/null || true)
    missing=()
    for t in "${targets[@]}"; do grep -qx "$t" <<<"$installed" || missing+=("$t"); done
    if ((${#missing[@]})); then
        log "rustup target add ${missing[*]}"
        rustup target add "${missing[@]}"
    fi
fi

# A hung test must fail the run, not stall it: every test binary runs
# under `timeout` (FTRAMP_TEST_TIMEOUT seconds, default 600; the slowest
# binary takes under a minute, natively or under qemu).  The variables
# override the runners of .cargo/config.toml for this script only.
limit=${FTRAMP_TEST_TIMEOUT:-600}
host=$(rustc -vV | sed -n 's/^host: //p')
runner_var() { local t=${1//-/_}; printf 'CARGO_TARGET_%s_RUNNER' "${t^^}"; }
export "$(runner_var "$host")=timeout -k 10 $limit"
# The cross runners as .cargo/config.toml writes them (["qemu-…", "-L", "…"]).
config_runner() {
    awk -v sec="[target.$1]" '$0 == sec { on = 1; next } /^\[/ { on = 0 }
        on && $1 == "runner" { gsub(/^[^[]*\[|\].*$|"|,/, ""); print; exit }' .cargo/config.toml
}
for t in "${targets[@]}"; do
    export "$(runner_var "$t")=timeout -k 10 $limit $(config_runner "$t")"
done

log "native tests (codegen, snapshots, oracle, JIT on $(uname -m), objects on every arch)"
cargo test --workspace --locked

if ((native_only == 0)); then
    # The JIT path on each foreign arch this build has a backend for.
    for t in $(cargo run -q --locked -p ftramp -- archs --rust-targets); do
        [[ "$t" == "$host" ]] && continue
        log "runtime and JIT tests for $t under qemu-user"
        pkgs=(-p ftramp-exectest -p ftramp-runtime)
        # The ops engine (live patching), its samples, the C API and the
        # recorder behind `ftramp record` exist for aarch64 too.
        [[ "$t" == aarch64-* ]] && pkgs+=(-p ftrace-ops -p ftramp-capi -p fprobe-example)
        cargo test --locked "${pkgs[@]}" --target "$t"
        if [[ "$t" == aarch64-* ]]; then
            # One test at a time: each recorder test starts processes, and
            # qemu-user 7.2 can deadlock a child forked while another thread
            # of the test process is inside the emulator (a child with two
            # threads asleep on futexes, until the run's timeout).
            log "recorder tests for $t under qemu-user, one at a time"
            RUST_TEST_THREADS=1 cargo test --locked -p ftramp-recorder --target "$t"
        fi
    done
fi
log "all tests passed"
