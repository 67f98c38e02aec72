#!/usr/bin/python3
"""Compile the sandbox's seccomp deny-list to a BPF file for `bwrap --seccomp FD`.

Usage: /usr/bin/python3 seccomp_filter.py OUT.bpf   (needs Debian's python3-seccomp)

Default action is ALLOW; listed syscalls fail with an errno so snippets see an ordinary OSError
instead of dying. The program is architecture-specific, so it is generated at pool start, never
committed. Exit code 3 means python3-seccomp is missing (the pool logs that and degrades).
"""

import errno
import socket
import sys

try:
    from seccomp import ALLOW, ERRNO, MASKED_EQ, NE, Arg, SyscallFilter
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
]

# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
CLONE_NEW_FLAGS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                   0x40000000, 0x00000080]


def build():
    f = SyscallFilter(defaction=ALLOW)
    eperm = ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            f.add_rule(eperm, name)
        except (RuntimeError, ValueError):
            pass  # not a syscall on this architecture / libseccomp version
    # AF_UNIX only: socketpair for multiprocessing/asyncio works, TCP/UDP/raw/netlink do not
    f.add_rule(ERRNO(errno.EAFNOSUPPORT), "socket", Arg(0, NE, socket.AF_UNIX))
    for flag in CLONE_NEW_FLAGS:
        f.add_rule(eperm, "clone", Arg(0, MASKED_EQ, flag, flag))
    # clone3 passes flags in memory that seccomp cannot inspect; ENOSYS makes glibc use clone
    f.add_rule(ERRNO(errno.ENOSYS), "clone3")
    return f


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: seccomp_filter.py OUT.bpf\n")
        sys.exit(2)
    with open(sys.argv[1], "wb") as out:
        build().export_bpf(out)
