/* The C floor of a cage like the bench's (tests/bench/daemon.py times it beside the rest): one
 * process clones the target into new pid, mount, net, ipc, uts and cgroup namespaces, which
 * mounts a tmpfs at STAGING, binds ROOT read-only below it with /proc, /dev and /tmp, pivots
 * into it, detaches the old root and execs /true; the parent waits. No daemon, no ptrace
 * observation, no cgroup ceilings, landlock, seccomp, capability drop or record: what any cage
 * of this shape costs on this host, at least.
 *
 * With a third argument N it launches N cages one after another, each after SETTLE microseconds
 * idle (the fourth argument, default 0), and prints each one's clone to waitpid time in
 * microseconds, timed inside this process: the floor of a launch from a process already running
 * (as a daemon's is), without this program's own spawn and start-up.
 *
 *   gcc -O2 -o floor floor.c && sudo ./floor ROOT STAGING [N [SETTLE]] */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *root, *staging;
static char stack[1 << 16];

static int child(void *unused) {
    (void)unused;
    char r[4096];
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
        mount("tmpfs", staging, "tmpfs", 0, "size=1m"))
        _exit(10);
    snprintf(r, sizeof r, "%s/r", staging);
    mkdir(r, 0755);
    if (mount(root, r, NULL, MS_BIND | MS_REC, NULL) ||
        mount(NULL, r, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) || chdir(r) ||
        mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) ||
        mount("tmpfs", "dev", "tmpfs", MS_NOSUID, "size=64k") ||
        mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m"))
        _exit(11);
    if (syscall(SYS_pivot_root, ".", ".") || umount2(".", MNT_DETACH) || chdir("/"))
        _exit(12);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    char *argv[] = {"/true", NULL};
    execv("/true", argv);
    _exit(127);
}

static int launch(void) {
    int flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP;
    pid_t p = clone(child, stack + sizeof stack, flags | SIGCHLD, NULL);
    int st;
    if (p < 0 || waitpid(p, &st, 0) < 0)
        return 1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5)
        return 2;
    root = argv[1];
    staging = argv[2];
    if (argc == 3)
        return launch();
    long settle = argc == 5 ? atol(argv[4]) : 0;
    for (int i = atoi(argv[3]); i > 0; i--) {
        if (settle > 0)
            usleep(settle);
        long long t = now_ns();
        int rc = launch();
        if (rc)
            return rc;
        printf("%lld\n", (now_ns() - t) / 1000);
    }
    return 0;
}
