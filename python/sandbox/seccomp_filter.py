#!/usr/bin/python3
"""Compile the sandbox's seccomp deny-list to a BPF file for `bwrap --seccomp FD`.

Usage: /usr/bin/python3 seccomp_filter.py OUT.bpf [--landlock]   (needs Debian's python3-seccomp)

--landlock adds what bubblewrap's namespaces give the other mode (LANDLOCK_ONLY).

Default action is ALLOW; listed syscalls fail with an errno so snippets see an ordinary OSError
instead of dying. The program is architecture-specific, so it is generated at pool start, never
committed. Exit code 3 means python3-seccomp is missing (the pool logs that and degrades).
"""

import errno
import signal
import socket
import sys

try:
    from seccomp import ALLOW, EQ, ERRNO, MASKED_EQ, NE, Arg, SyscallFilter
except ImportError:
    sys.stderr.write(f"{sys.executable} cannot import seccomp (apt-get install python3-seccomp)\n")
    sys.exit(3)

DENIED = [
    # leaving or reshaping the sandbox
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # reading or steering other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # kernel surface no snippet needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl",
    "open_by_handle_at", "name_to_handle_at", "personality", "vhangup", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm",
    "fanotify_init",
    # System V / POSIX IPC objects outlive the process: a channel between runs
    "shmget", "semget", "msgget", "mq_open",
    # memory no per-call count sees (issue 42): a memfd's pages are in no process's RSS until mapped (768 MB under a
    # 128 MB limit), memfd_secret's are hidden from the kernel itself. Nothing a snippet imports uses them (CPython's
    # os.memfd_create is the only caller in Debian's python3.11, numpy and OpenBLAS), and anonymous shared memory is
    # still there, counted, through mmap and /dev/shm
    "memfd_create", "memfd_secret",
    # the page cache state of any file it can open: a side channel on what other calls read (Linux 6.5)
    "cachestat",
    # a session is stopped between its cells (broker.py, Broker.check_between); a POSIX timer can deliver SIGCONT to
    # its own process again and again. Python's stdlib, numpy and OpenBLAS do not create one (threads, sleeps and
    # setitimer do not need it)
    "timer_create",
]

# isolation landlock runs in the host's network and pid namespaces (issue 42). Without a mount namespace every pathname
# UNIX socket of the host is a connect() away where its mode lets any uid write it, and Landlock (ABI 7) does not
# govern connect(); seccomp cannot read the address, so no AF_UNIX address is reachable at all: connect, sendmsg and
# sendmmsg are refused, and sendto only without an address. socketpair() and fork's inherited pipes and sockets,
# which multiprocessing's Pool and asyncio use, keep working; multiprocessing.Manager and Listener do not.
# Without a pid namespace the calls that answer for any pid tell a host pid (found) from an unused one (ESRCH):
# they are refused for every pid but 0 (the caller).
UNIX_ADDRESSED = ["connect", "sendmsg", "sendmmsg"]
PID_FIRST = ["getsid", "getpgid", "setpgid", "sched_getaffinity", "sched_setaffinity", "sched_getscheduler",
             "sched_setscheduler", "sched_getparam", "sched_setparam", "sched_getattr", "sched_setattr",
             "sched_rr_get_interval", "prlimit64", "get_robust_list", "migrate_pages", "move_pages"]
PID_SECOND = ["getpriority", "setpriority", "ioprio_get", "ioprio_set"]  # (which, who)
PID_ANY = ["capget"]  # its pid is in memory seccomp cannot read; pidfd_open, which the zygote needs: zygote.py

SO_SNDBUFFORCE, F_SETSIG = 32, 10  # asm-generic/socket.h, asm-generic/fcntl.h; Python's modules lack both

# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
CLONE_NEW_FLAGS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                   0x40000000, 0x00000080]


def build(landlock=False):
    f = SyscallFilter(defaction=ALLOW)
    eperm = ERRNO(errno.EPERM)

    def deny(name, *args):
        try:
            f.add_rule(eperm, name, *args)
        except (RuntimeError, ValueError):
            pass  # not a syscall on this architecture / libseccomp version

    for name in DENIED:
        deny(name)
    if landlock:
        for name in UNIX_ADDRESSED + PID_ANY:
            deny(name)
        deny("sendto", Arg(4, NE, 0))
        for name in PID_FIRST:
            deny(name, Arg(0, NE, 0))
        for name in PID_SECOND:
            deny(name, Arg(1, NE, 0))
    # AF_UNIX only: socketpair for multiprocessing/asyncio works, TCP/UDP/raw/netlink do not
    f.add_rule(ERRNO(errno.EAFNOSUPPORT), "socket", Arg(0, NE, socket.AF_UNIX))
    # A socket's send buffer bounds what it can pin in its peer's queue; raised (to 2 x net.core.wmem_max, 8 MB here)
    # it would break the per-socket bound the memory check charges (broker.py, socket_memory_kb)
    for opt in (socket.SO_SNDBUF, SO_SNDBUFFORCE):
        deny("setsockopt", Arg(1, EQ, socket.SOL_SOCKET), Arg(2, EQ, opt))
    # What would continue a stopped session again and again (timer_create above): F_SETSIG makes an fd's readiness,
    # a lease break or a dnotify event (another call writing /dev/shm) send any signal, SIGCONT included. A child
    # whose exit signal is SIGCONT (clone's low byte; fork's is SIGCHLD) would continue it once, when killed.
    deny("fcntl", Arg(1, EQ, F_SETSIG))
    deny("clone", Arg(0, MASKED_EQ, 0xFF, signal.SIGCONT))
    for flag in CLONE_NEW_FLAGS:
        f.add_rule(eperm, "clone", Arg(0, MASKED_EQ, flag, flag))
    # clone3 passes flags in memory that seccomp cannot inspect; ENOSYS makes glibc use clone
    f.add_rule(ERRNO(errno.ENOSYS), "clone3")
    return f


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--landlock"]):
        sys.stderr.write("usage: seccomp_filter.py OUT.bpf [--landlock]\n")
        sys.exit(2)
    with open(sys.argv[1], "wb") as out:
        build(landlock=len(sys.argv) == 3).export_bpf(out)
