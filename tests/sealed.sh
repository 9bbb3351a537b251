#!/bin/sh
# Run a command as root with the host's root file system read-only, in a mount namespace of its
# own: only this repository, /tmp, /var/tmp, /run, cargo's home and /etc/nsswitch.conf (which a daemon
# test edits and puts back) stay writable. Other mounts (/proc, /sys, /dev, cgroups) are as they
# are. For runs that may hold broken code — a mutation run turns checks off one by one, and one
# such mutant of a path walk, run unsealed as root, once deleted this machine's /etc. The run
# has a UTS namespace of its own too: a mutant that names the host where it should name a cage
# (`sethostname` outside the cage's namespace) once renamed this machine "chio". And a pid
# namespace of its own, with its own /proc: a mutant that cloned a cage's init without its own
# pid namespace once sealed every memfd of this machine (the init writes vm.memfd_noexec, which
# is per pid namespace, through its procfs); nor can a mutant signal a host process by pid.
#
#   sudo tests/sealed.sh COMMAND ARGS...
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "tests/sealed.sh: needs root (it makes a mount namespace)" >&2
    exit 2
fi
export CHIO_SEALED=1
exec unshare --mount --uts --pid --fork --mount-proc --propagation private sh -eu -c '
    for w in "$PWD" /tmp /var/tmp /run "${CARGO_HOME:-$HOME/.cargo}" /etc/nsswitch.conf; do
        mount --bind "$w" "$w"
    done
    # bind: the root mount of this namespace only, never the file system (the host keeps it rw).
    mount -o remount,bind,ro /
    # Our working directory was looked up before its bind: look it up again, through the bind.
    cd "$PWD"
    if touch /etc/chio-sealed-probe 2>/dev/null; then
        rm -f /etc/chio-sealed-probe
        echo "tests/sealed.sh: / is still writable; not running" >&2
        exit 2
    fi
    # Not exec: this shell is PID 1 of the run'"'"'s pid namespace, and reaps what is orphaned in it
    # while it waits (a command that does not would leave zombies that "no process left"
    # checks count).
    "$@"' sealed "$@"
