#!/bin/sh
# Mutation testing of the checks behind FullyEnforced (not part of the test run; needs root and
# `cargo install cargo-mutants`). Each mutant of the named files is built and tested; a MISSED
# mutant is a check that can be weakened without a test failing.
#
#   sudo tests/mutants.sh            observe.rs and the seccomp filter (unit tests: a few minutes)
#   sudo tests/mutants.sh --e2e      identity.rs, landlock.rs and mounts.rs against the cage's own
#                                    tests, the CLI's and the real-cage suites (about a minute a
#                                    mutant on a 2-core machine: five hours; `--shard k/n` splits it)
#
# Results land in target/mutants/ (mutants.out/outcomes.json, missed.txt). `--crate PKG [FILE...]`
# runs one crate's mutants against that crate's own tests (e.g. `--crate chio-kernel`).
set -eu
cd "$(dirname "$0")/.."
# Each mutant runs as root with a check turned off: the whole run is sealed (tests/sealed.sh),
# the host's root file system read-only but for this repository and scratch space.
if [ -z "${CHIO_SEALED:-}" ]; then
    exec tests/sealed.sh tests/mutants.sh "$@"
fi
command -v cargo-mutants >/dev/null || cargo install --locked cargo-mutants
export CI=true
# A scratch copy has no target/ of its own: the suites that need the mini-swe-agent venv
# `.ci/run` made are pointed at this tree's (without it every session test would fail under
# CI=true, and every mutant count as caught).
if [ -z "${CHIO_MSA_PYTHON:-}" ] && [ -x target/msa-venv/bin/python ]; then
    export CHIO_MSA_PYTHON="$PWD/target/msa-venv/bin/python"
fi
# Scratch copies of the tree go under target/, not /tmp.
export TMPDIR="$PWD/target/mutants-tmp"
mkdir -p "$TMPDIR"
if [ "${1:-}" = "--e2e" ]; then
    shift
    # chio-cli is among the tested packages so that cargo builds the `chio` the cage suites drive
    # (with `--test-package chio-tests` alone every mutant would meet the stale-binary guard and
    # count as caught; per-target `--test` filters make cargo refuse packages without those
    # targets). The suite takes about a minute; the auto timeout from the baseline is too short.
    # CHIO_MUTANTS_FILES narrows the run (e.g. "cage/src/mounts.rs"), CHIO_MUTANTS_OUT names its
    # output directory (so one file's run does not replace another's). The slowest suites are
    # skipped — mini-swe-agent's, the session walkthroughs (the Rust one builds and imports an
    # image), the packaging suite's .deb and systemd-analyze: they drive the same cage for a
    # minute and more a mutant, and a skipped test can only turn a caught mutant into a missed
    # one, never the other way.
    files=""
    for f in ${CHIO_MUTANTS_FILES:-cage/src/identity.rs cage/src/landlock.rs cage/src/mounts.rs}; do
        files="$files -f $f"
    done
    # CHIO_MUTANTS_TIMEOUT (seconds, default 240) bounds one mutant's tests: a mutant that makes
    # launches hang (the init never reports) costs that much each.
    # CHIO_MUTANTS_TESTS="escape exec_stop ..." runs only those test targets of chio-tests, the
    # unit tests (the libraries' and the `chio` binary's own, `--bins`: the daemon's configuration
    # is tested there) and the CLI's cli_args (whose presence makes cargo build the `chio` binary
    # the suites drive).
    # CHIO_MUTANTS_SKIP replaces the list of skipped tests (cargo test's `--skip` filters), e.g.
    # "rust_calculator" when mutating the session code the other walkthroughs drive.
    skips=""
    for t in ${CHIO_MUTANTS_SKIP:-mini_swe_agent_environments walkthrough session_runs_nothing killed_run \
        worker_stopped debian_package systemd_analyze privileged_units_grant booted_systemd}; do
        skips="$skips --skip $t"
    done
    targets=""
    if [ -n "${CHIO_MUTANTS_TESTS:-}" ]; then
        # cargo-mutants' baseline tests the mutated package alone, where these targets do not
        # exist: it is skipped, and the named suites run here on the unmutated tree instead (a
        # suite failing already would count every mutant caught).
        set -- --baseline=skip "$@"
        targets="--lib --bins --test cli_args"
        for t in $CHIO_MUTANTS_TESTS; do
            targets="$targets --test $t"
        done
        # shellcheck disable=SC2086
        # One log a run: runs with other output directories may go at the same time.
        log="$TMPDIR/baseline-$(basename "${CHIO_MUTANTS_OUT:-target/mutants-e2e}").log"
        if ! cargo test -q -p chio-cage -p chio-supervisor -p chio-cli -p chio-tests $targets -- $skips >"$log" 2>&1; then
            echo "tests/mutants.sh: the named suites fail on the unmutated tree; see $log" >&2
            exit 1
        fi
    fi
    # shellcheck disable=SC2086
    cargo mutants $files \
        --test-package=chio-cage,chio-supervisor,chio-cli,chio-tests \
        --timeout "${CHIO_MUTANTS_TIMEOUT:-240}" -o "${CHIO_MUTANTS_OUT:-target/mutants-e2e}" -j 1 "$@" -- $targets -- $skips
elif [ "${1:-}" = "--crate" ]; then
    pkg=$2
    shift 2
    args=""
    for a in "$@"; do
        case "$a" in
            -*) args="$args $a" ;;
            *) args="$args -f $a" ;;
        esac
    done
    # shellcheck disable=SC2086
    cargo mutants -p "$pkg" $args -o "${CHIO_MUTANTS_OUT:-target/mutants-$pkg}" -j 2
else
    cargo mutants -f cage/src/observe.rs -f cage/src/seccomp.rs -o target/mutants -j 2
fi
