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
 * With `serve SOCKET` it is the floor of a daemon of chio's shape: it listens on SOCKET, and for
 * each connection reads one request line with its descriptors (the client's stdout and stderr),
 * hands them over a SOCK_SEQPACKET queue to a worker forked ahead of the request (as chio's
 * daemon hands a job to its spare), and forks the next worker. The worker launches the cage
 * above with the client's descriptors as the target's stdout and stderr, waits, and writes
 * `{"exit_status":N}` and a newline to the client itself. So a request takes the same process
 * hops as one through chio's daemon (client, server, worker, client) and none of its work: no
 * journal, no admission, no checks.
 *
 *   gcc -O2 -o floor floor.c && sudo ./floor ROOT STAGING [N [SETTLE] | serve SOCKET] */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <string.h>
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

/* Receive a message and up to `max` descriptors; returns the bytes read (0 at EOF, -1 on error). */
static ssize_t recv_fds(int sock, char *buf, size_t len, int *fds, int max, int *got) {
    char ctl[CMSG_SPACE(8 * sizeof(int))];
    struct iovec iov = {buf, len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    *got = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); n >= 0 && c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (*got < max)
                    fds[(*got)++] = fd;
                else
                    close(fd);
            }
    return n;
}

static int send_fds(int sock, const int *fds, int n) {
    char ctl[CMSG_SPACE(3 * sizeof(int))] = {0};
    struct iovec iov = {"job", 3};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = CMSG_SPACE(n * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n * sizeof(int));
    return sendmsg(sock, &m, 0) < 0 ? -1 : 0;
}

/* A worker: takes one job (the connection, stdout, stderr) off the queue, launches, answers. */
static void worker(int queue) {
    signal(SIGCHLD, SIG_DFL); /* its cage is waited for */
    char b[8];
    int fds[3], got;
    if (recv_fds(queue, b, sizeof b, fds, 3, &got) <= 0 || got != 3)
        _exit(1);
    int saved_out = dup(1), saved_err = dup(2);
    dup2(fds[1], 1);
    dup2(fds[2], 2);
    int rc = launch();
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    char answer[64];
    int len = snprintf(answer, sizeof answer, "{\"exit_status\":%d}\n", rc);
    if (write(fds[0], answer, len) != len)
        _exit(1);
    _exit(0);
}

/* Fork a worker waiting on `queue`; it keeps neither the listener nor the queue's sending end,
 * and dies with the server. */
static pid_t fork_worker(int listener, int sending, int queue) {
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(listener);
        close(sending);
        worker(queue);
    }
    return p;
}

static int serve(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int pair[2], l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (strlen(path) >= sizeof a.sun_path || l < 0)
        return 1;
    strcpy(a.sun_path, path);
    unlink(path);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 64) ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair))
        return 1;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* it ends with the bench that started it */
    signal(SIGCHLD, SIG_IGN);         /* workers are reaped by the kernel */
    if (fork_worker(l, pair[0], pair[1]) < 0)
        return 1;
    printf("listening on %s\n", path);
    fflush(stdout);
    for (;;) {
        int conn = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0)
            continue;
        /* The request line (it arrives with the descriptors in the first read; the rest, if any,
         * up to the newline). */
        char line[65536];
        int fds[3] = {conn, -1, -1}, got = 0;
        ssize_t n = recv_fds(conn, line, sizeof line, fds + 1, 2, &got);
        while (n > 0 && line[n - 1] != '\n') {
            ssize_t more = read(conn, line, sizeof line);
            n = more > 0 ? more : -1;
        }
        if (n > 0 && got == 2 && send_fds(pair[0], fds, 3) == 0)
            fork_worker(l, pair[0], pair[1]);
        for (int i = 0; i < 3; i++)
            if (fds[i] >= 0)
                close(fds[i]);
    }
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5)
        return 2;
    root = argv[1];
    staging = argv[2];
    if (argc == 5 && strcmp(argv[3], "serve") == 0)
        return serve(argv[4]);
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
