#!/bin/sh
# Mutation testing of the checks behind FullyEnforced (not part of the test run; needs root and
# `cargo install cargo-mutants`). Each mutant of the named files is built and tested; a MISSED
# mutant is a check that can be weakened without a test failing.
#
#   sudo tests/mutants.sh            observe.rs and the seccomp filter (unit tests: a few minutes)
#   sudo tests/mutants.sh --e2e      identity.rs, landlock.rs and mounts.rs against the suites that
#                                    run real cages (about a minute a mutant on a 2-core machine)
#
# Results land in target/mutants/ (mutants.out/outcomes.json, missed.txt).
set -eu
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install --locked cargo-mutants
export CI=true
# Scratch copies of the tree go under target/, not /tmp.
export TMPDIR="$PWD/target/mutants-tmp"
mkdir -p "$TMPDIR"
if [ "${1:-}" = "--e2e" ]; then
    # --bins builds the `chio` the suites drive (without it every mutant would meet the stale
    # binary guard and count as caught); the suites named are the ones that break each layer.
    cargo mutants -f cage/src/identity.rs -f cage/src/landlock.rs -f cage/src/mounts.rs \
        --test-workspace=true -o target/mutants -j 1 -- \
        --bins --test exec_stop --test layers --test claims --test host_side --test escape
else
    cargo mutants -f cage/src/observe.rs -f cage/src/seccomp.rs -o target/mutants -j 2
fi
