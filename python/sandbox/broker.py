"""rstar2 sandbox: the broker, which runs untrusted Python snippets through a zygote, one fresh fork per call.

Started by src/sandbox/pool.ts, normally inside one bubblewrap sandbox per pool, as
    /usr/bin/python3 -I -S broker.py
with u32 len | CONFIG_JSON first on its stdin (not in argv, which every process in the sandbox can read).

Processes:
  broker  (this file) talks to Node over stdin/stdout, owns every request's bytes, creates each call's
          pipes, keeps the wall clocks and wipes the slots.
  zygote  a fresh interpreter started before any request exists, running zygote.py: it preloads
          modules, then forks one child per call (and the session processes). zygote.py describes both
          and the broker <-> zygote messages.

Node -> broker frame (little endian): u32 len | u32 id | u32 timeout_ms | u32 mem_mb | payload
  The child's stdin gets u32 timeout_ms | u32 mem_mb (flags included), then the payload verbatim:
  u32 code_len | u32 files_len | code | files (JSON {"files": {name: base64}, "fetch": [name]}) |
  stdin. The broker never parses the payload.
  Bit 31 of mem_mb (FLAG_FETCH) asks for a result pipe on the child's fd 3, which carries the
  fetched files as JSON {name: base64} after the snippet ends.
  Bit 30 (FLAG_SESSION): the payload starts with u32 sid and the call runs in that session's
  warm interpreter (created on first use in one of the session slots). Bit 29 (FLAG_CLOSE): the
  payload is only u32 sid; the session is killed, nothing is answered for the frame itself.
Broker -> Node frame: u32 len | u32 id | u32 hdr_len | hdr JSON | stdout bytes | stderr bytes.
  id 0 is a control frame (ready / log / sessionGone).
"""

import errno
import fcntl
import json
import marshal
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
import types

def read_config():
    n = struct.unpack("<I", os.read(0, 4))[0]
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SystemExit("sandbox config cut short")
        data += chunk
    return json.loads(data)


CFG = read_config()
CG_FDS = (CFG.get("cgroup") or {}).get("fds", [])  # the slots' cgroup dirs, passed on fd 3 (and 4): see Cgroups
for _lo, _hi in zip([3, *(fd + 1 for fd in sorted(CG_FDS))], [*sorted(CG_FDS), 1024]):
    os.closerange(_lo, _hi)  # whatever else the launcher left open (bwrap's --args file names host paths)
MAX_OUT = int(CFG.get("maxOutputBytes", 1 << 20))
OUT_PAUSE_S = 0.01
SPLICE = getattr(os, "splice", None)  # Python >= 3.10
KILL_OUT = int(CFG.get("killOutputBytes", 16 << 20))
PREFORK = bool(CFG.get("prefork", True))
MEM_CHECK_S = float(CFG.get("memoryCheckMs", 100)) / 1000
SHM_SLOT_KB = int(CFG.get("shmMb", 0)) << 10  # each slot's share of /dev/shm, which is sized slots x this
SCRATCH_FILES = int(CFG.get("scratchFiles", 0))  # inodes a slot's scratch tmpfs may hold
# isolation landlock: the scratch is on the host's disk, not a tmpfs of the slot's own, so the broker bounds its size
# and how deep it nests (scratch_usage)
SCRATCH_KB = int(CFG.get("scratchMb", 0)) << 10
SCRATCH_DEPTH = 64
WALK_SHARE = 0.05  # of one core, at most, for those listings (Broker.check_memory)
DEMOTE_S = float(CFG.get("demoteAfterMs", 0)) / 1000  # a call running longer gets nice 19, if it computes (demote)
DEMOTE_CPU_S = DEMOTE_S / 10
BASE_NICE = os.getpriority(os.PRIO_PROCESS, 0)  # where calls start: the zygote forks them at the broker's nice
# With autogroups the CPU is shared between sessions first and every call is a session of its own, so a
# demoted call's session weight is lowered too (Broker.set_autogroups)
AUTOGROUP = DEMOTE_S > 0 and os.path.exists("/proc/self/autogroup")
INF = float("inf")
# How long before its deadline a call's process is told to flush its output (zygote.flush_output). It must get a
# CPU and reach a bytecode boundary first: after 50 ms a call runs at nice 19, and on a full host that can take tens
# of ms. A wide margin costs little, since the streams stay line-buffered until the kill; short limits get half.
FLUSH_MARGIN_S = 0.1
EXIT_POLL_S = 0.002  # how often a call that has reported its exit is looked at until its process is seen exiting
SPAWN_RETRY_S = 0.02  # after a failed fork, how long until the zygote is asked to fork again
PROCS_WHY = "its processes filled the host's process limit while another call could not start"
ZYGOTE_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
with open(ZYGOTE_PY, "rb") as _f:
    ZYGOTE_CODE = compile(_f.read(), ZYGOTE_PY, "exec")
zygote = types.ModuleType("rstar2_zygote")  # its constants and helpers, shared with the broker
zygote.CFG = CFG
sys.modules[zygote.__name__] = zygote
exec(ZYGOTE_CODE, zygote.__dict__)
from rstar2_zygote import (  # noqa: E402
    EXIT, EXIT_MAGIC, FLAG_CLOSE, FLAG_FETCH, FLAG_REPORT, FLAG_SESSION, FLAGS, LIM, MAX_FETCH, REASON_CLOSED,
    REASON_BETWEEN, REASON_MEMORY, REASON_NONE, REASON_OUTPUT, REASON_PROCS, REASON_SPAWN, REASON_TIMEOUT, SDONE, SESSION_SLOTS, SHM,
    SLOT_MODE, SLOTS, ZKILL, ZRES, ZRUN, log, UID_BASE, slot_dir, slot_uid,
)

CAP_SYS_ADMIN = 21
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 2, 4, 8, 32


def hide_pids():
    """bubblewrap as root (issue 42, break 5): /proc showed every call the processes of every other (argv, CPU,
    RSS). Remounted with hidepid=2 a process sees only those it may ptrace, its own uid's, and members of the mount's
    gid (0, the default), the broker and zygote, see all. bwrap has no such option, so the broker, given
    CAP_SYS_ADMIN for this alone, remounts it before any request exists and then drops the capability: with
    no_new_privs (bwrap's) the zygote's exec cannot get it back."""
    libc = zygote.libc
    if libc.mount(None, b"/proc", None, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2") != 0:
        log(f"/proc could not be remounted with hidepid=2 (errno {zygote.ctypes.get_errno()}): calls see each other's "
            "processes")
    hdr = zygote.ctypes.create_string_buffer(struct.pack("<Ii", 0x20080522, 0), 8)  # _LINUX_CAPABILITY_VERSION_3
    data = zygote.ctypes.create_string_buffer(24)  # 2 x (effective, permitted, inheritable)
    if libc.capget(hdr, data) != 0:
        raise OSError(zygote.ctypes.get_errno(), "capget")
    caps = list(struct.unpack("<6I", data.raw))
    for i in range(3):
        caps[i] &= ~(1 << CAP_SYS_ADMIN)  # ambient follows: it cannot hold what permitted lacks
    if libc.capset(hdr, zygote.ctypes.create_string_buffer(struct.pack("<6I", *caps), 24)) != 0:
        raise OSError(zygote.ctypes.get_errno(), "capset")


class Cgroups:
    """Kernel-enforced limits (issue 56 item 1): a memory and a pids cgroup per slot, made by the pool before the
    sandbox started (src/sandbox/cgroups.ts) and passed as directory fds. Each call's process moves itself into its
    slot's groups (zygote.CG_ENTER) before it drops root; the broker sets the slot's memory limit to the call's
    before the call gets its request, and a count of the group's OOM kills that rose during a call makes it `oom`.
    Polling (check_memory) stays beside it, for what no group counts the same way (/dev/shm shares, socket queues).
    v1 (separate memory and pids hierarchies) or v2 (one group with both controllers)."""

    def __init__(self, cfg):
        self.version = int(cfg["version"])
        dirs = [self.high(fd) for fd in cfg["fds"]]
        mem_dir, pids_dir = (dirs[0], dirs[1]) if self.version == 1 else (dirs[0], dirs[0])

        def at(d, slot, name, flags=os.O_WRONLY):
            return self.high(os.open(f"{slot}/{name}", flags | os.O_CLOEXEC, dir_fd=d))

        v1 = self.version == 1
        try:  # swap in use: v1 bounds memory and swap together (memsw), or a call could hold more in swap
            swap = v1 and len(open("/proc/swaps").read().splitlines()) > 1
        except OSError:
            swap = v1
        self.procs = []  # per slot: the cgroup.procs fds a child writes "0" to; inherited by the zygote only
        self.limit = []  # per slot: the memory limit files, in the order a raised limit is written
        self.events = []  # per slot: memory.oom_control (v1) or memory.events (v2), for the OOM kill count
        for slot in range(SLOTS):
            procs = [at(mem_dir, slot, "cgroup.procs")] + ([at(pids_dir, slot, "cgroup.procs")] if v1 else [])
            for fd in procs:
                os.set_inheritable(fd, True)
            self.procs.append(procs)
            names = (["memory.memsw.limit_in_bytes"] if swap else []) + ["memory.limit_in_bytes"] if v1 else ["memory.max"]
            self.limit.append([at(mem_dir, slot, n) for n in names])
            if not v1:
                try:
                    os.write(at(mem_dir, slot, "memory.swap.max"), b"0")  # swap would be memory past the limit
                except FileNotFoundError:
                    pass  # no swap accounting: no swap either
            # v1: the OOM kills (memory.oom_control) and the times the group reached its limit (memory.failcnt);
            # v2: both in memory.events
            # (with swap accounting the group meets its memsw limit first, counted in memory.memsw.failcnt)
            names = ["memory.oom_control", "memory.failcnt"] + (["memory.memsw.failcnt"] if swap else []) if v1 else ["memory.events"]
            self.events.append([at(mem_dir, slot, n, os.O_RDONLY) for n in names])
            with os.fdopen(at(pids_dir, slot, "pids.max"), "wb") as f:
                f.write(str(zygote.NPROC).encode())
        for d in set(dirs):
            os.close(d)
        self.mb = [0] * SLOTS  # each slot's memory limit now (0: none set yet)
        self.seen = [self.ooms(slot) for slot in range(SLOTS)]  # each slot's OOM kills, as last counted
        # per slot: since its call started, the kernel killed one of its processes without the group at its limit,
        # so for the host's or a container's memory. Node's guess from the host-wide count took a snippet's own
        # kill -9 for an OOM kill whenever another program on the host was OOM-killed within 10 s.
        self.host = [False] * SLOTS
        self.hit = [False] * SLOTS  # per slot: its group reached its limit since its call started

    @staticmethod
    def high(fd):
        """The fd moved above the numbers the broker and zygote dup2 onto (0-4): it must survive those."""
        if fd >= 10:
            return fd
        new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(fd)
        return new

    def set_limit(self, slot, mb):
        """The slot's group holds at most mb MiB (RAM and swap) from now on; written only when it changes."""
        if mb == self.mb[slot]:
            return
        files = self.limit[slot] if mb > self.mb[slot] else self.limit[slot][::-1]  # memsw >= limit, always
        value = str(mb << 20).encode() if mb else (b"-1" if self.version == 1 else b"max")
        for fd in files:
            try:
                os.pwrite(fd, value, 0)
            except OSError as e:  # EBUSY: the group holds more than that (a leftover being killed); polling bounds it
                log(f"slot {slot}: cgroup memory limit {mb} MiB not set ({e})")
                return
        self.mb[slot] = mb

    def start(self, slot, mb):
        """A call or cell starts in the slot: its limit, and the OOM counts from here on are its own (a killed
        call's leftovers may have been OOM-killed after its answer, and nobody asked then)."""
        self.set_limit(slot, mb)
        self.seen[slot] = self.ooms(slot)
        self.host[slot] = self.hit[slot] = False

    def ooms(self, slot):
        """(OOM kills of the slot's processes, times its group reached its own limit) so far."""
        fds = self.events[slot]
        f = dict(line.split(None, 1) for line in os.pread(fds[0], 4096, 0).splitlines() if line)
        hits = sum(int(os.pread(fd, 64, 0)) for fd in fds[1:]) if len(fds) > 1 else int(f.get(b"oom", 0))
        return int(f.get(b"oom_kill", 0)), hits

    def oom_since(self, slot, sigkill=False):
        """Whether the kernel killed a process of the slot for the slot's own limit since this was last asked. A
        kill without the group at its limit is the host's or a container's memory running out (pool.ts says so).
        sigkill: the call's process died of a SIGKILL nobody here sent. The OOM killer counts its kill only after
        sending it (the kernel's __oom_kill_process), so the victim may be reaped and reported before the count
        rises: where the group reached its limit, the counts are looked at again for up to 20 ms. Only there, so
        a snippet that kills itself costs the broker (every call's) no wait."""
        n = self.ooms(slot)
        old = self.seen[slot]
        for _ in range(20 if sigkill else 0):
            if n[0] > old[0] or not (self.hit[slot] or n[1] > old[1]):
                break
            time.sleep(0.001)
            n = self.ooms(slot)
        self.seen[slot] = n
        self.hit[slot] |= n[1] > old[1]  # at its limit at any time since the call started, not only since last asked
        if n[0] > old[0] and not self.hit[slot]:
            self.host[slot] = True
        return n[0] > old[0] and self.hit[slot]


CG = None
if CG_FDS:
    try:
        CG = Cgroups(CFG["cgroup"])
        CFG["cgroupProcs"] = CG.procs  # for the zygote, which gets CFG at its start
    except OSError as _e:
        log(f"the slots' cgroups cannot be used ({_e!r}): memory and process limits are polled")
    for _fd in CG_FDS:
        try:
            os.close(_fd)
        except OSError:
            pass
LIMITS = f"cgroup v{CG.version}" if CG else "polling"

SOCK_DIAG = None
try:  # before the seccomp filter below, which refuses every socket but AF_UNIX (see socket_memory_kb)
    SOCK_DIAG = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
except OSError as _e:
    log(f"no sock_diag socket ({_e}): memory in a call's socket buffers is not counted")
if CFG.get("hidePids"):
    hide_pids()
if CFG.get("brokerSeccompPath"):  # bubblewrap: loaded here, not by bwrap, so the two steps above could run
    zygote._prctl(zygote.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # bwrap's already; a filter needs it without privilege
    zygote.install_filter(CFG["brokerSeccompPath"])

# The zygote's interpreter: it reads CFG and zygote.py's compiled code from fd 4 (marshal, so it neither
# parses JSON nor compiles source) and talks to the broker on fd 3.
ZYGOTE_BOOT = """import marshal, os, sys
with os.fdopen(4, "rb") as f:
    cfg, code = marshal.load(f)
m = type(sys)("rstar2_zygote")
m.CFG = cfg
sys.modules[m.__name__] = m
exec(code, m.__dict__)
m.zygote_main(3)
"""


def start_zygote():
    """Starts the zygote; returns (pid, the broker's end of its socket)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    pid = os.fork()  # before any request is read: the zygote never holds request data
    if pid == 0:
        try:
            os.dup2(b.fileno(), 3)
            os.dup2(r, 4)
            # LD_BIND_NOW: the dynamic linker resolves every symbol once here instead of on each child's first
            # call of setresuid, setsid, umask, ... (a symbol lookup and a GOT write: ~11 page faults per call)
            env = {**os.environ, "LD_BIND_NOW": "1"}
            os.execve(sys.executable, [sys.executable, "-I", "-S", "-c", ZYGOTE_BOOT], env)
        finally:
            os._exit(3)
    b.close()
    os.close(r)
    try:
        with os.fdopen(w, "wb") as f:
            f.write(marshal.dumps((CFG, ZYGOTE_CODE)))
    except BrokenPipeError:
        pass  # it died at once; Broker.start reports that
    return pid, a


PF_EXITING = 0x4  # include/linux/sched.h


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (the first is the state, field 3), or None once the
    process is reaped."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.read(fd, 1024)
    except OSError:
        return None  # reaped meanwhile (ESRCH)
    finally:
        os.close(fd)
    return st[st.rfind(b")") + 2:].split()


def exiting(pid):
    """Whether process pid is in its exit with no other thread left, so that none of a snippet's code runs in it
    again: its flags (field 9 of /proc/PID/stat) and its thread count (field 20). A leader that left by the exit
    system call while another thread runs on has PF_EXITING too, hence the count. False once reaped: the zygote's
    report is on its way."""
    f = stat_fields(pid)
    return f is not None and len(f) > 17 and int(f[6]) & PF_EXITING and f[17] == b"1"


def cpu_s(pids, enough=INF):
    """CPU time the processes pids have run, in seconds (each main thread's, from /proc/PID/schedstat, in ns: the
    ticks of /proc/PID/stat truncate each process to 10 ms, and a fork bomb's few hundred forks each showed 0);
    the count stops once past enough."""
    ns = 0
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)  # half the time of open(): a read per cell
        except OSError:
            continue  # gone meanwhile
        try:
            ns += int(os.read(fd, 64).split(None, 1)[0])
        except (OSError, ValueError, IndexError):
            pass
        finally:
            os.close(fd)
        if ns >= enough * 1e9:
            break
    return ns / 1e9


def wait_readable(fd, seconds):
    """select() refuses fds past 1023, which a broker with ~250 slots or more has (~4 per slot)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(seconds * 1000))


def nonblocking(fd):
    """For a fresh pipe end, whose only status flag is its access mode (which F_SETFL ignores): one system call,
    where os.set_blocking reads the flags first."""
    fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)


EMPTY_SIZE = {}  # dir -> its st_size when empty, for dirs whose size counts their entries


def learn_empty_size(d):
    """Records the size of d, now empty, if its size counts its entries (tmpfs: 20 bytes each; ext4 does not),
    found by trying. wipe then recognises an empty dir with one stat instead of listing it (~10 syscalls)."""
    try:
        with os.scandir(d) as it:
            if next(it, None) is not None:
                return
        empty = os.stat(d).st_size
        probe = os.path.join(d, ".rstar2-size-probe")
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        try:
            one = os.stat(d).st_size
        finally:
            os.unlink(probe)
        if one > empty == os.stat(d).st_size:
            EMPTY_SIZE[d] = empty
    except OSError:
        pass


def clear_dir(root):
    """Deletes everything under the open directory fd `root`, without recursion and with at most two fds open:
    a non-empty subdirectory's entries are first moved up into root. A snippet can nest directories
    thousands deep (shutil.rmtree recursed once per level, and its RecursionError ended the broker) or make
    paths longer than PATH_MAX; neither matters here. Returns how many entries could not be removed."""
    n = 0
    failed = 0
    while True:
        with os.scandir(root) as it:
            entries = list(it)
        if not entries or failed >= len(entries):
            return failed
        failed = 0
        for e in entries:
            name = e.name
            try:
                if not e.is_dir(follow_symlinks=False):  # the type listed with the name: no stat per entry
                    os.unlink(name, dir_fd=root)
                    continue
                try:
                    os.rmdir(name, dir_fd=root)
                    continue
                except OSError:
                    pass
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
                try:
                    os.chmod(sub, 0o700)  # the snippet may have made it unreadable to its owner
                    for child in os.listdir(sub):
                        n += 1
                        os.rename(child, f".rstar2-wipe-{n}", src_dir_fd=sub, dst_dir_fd=root)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=root)
            except OSError:
                failed += 1  # a name clash or a race: the next round retries it


def left_as_found(d):
    """Whether dir d is empty with its mode (SLOT_MODE): one stat where d's empty size is known (see learn_empty_size), else
    a listing (a disk file system, as under isolation landlock), still far cheaper than a trip to the wiper."""
    st = os.stat(d)
    if st.st_mode & 0o7777 != SLOT_MODE:
        return False
    empty = EMPTY_SIZE.get(d)
    if empty is not None:
        return empty == st.st_size
    with os.scandir(d) as it:
        return next(it, None) is None


def shm_empty():
    return EMPTY_SIZE.get(SHM, -1) == os.stat(SHM).st_size


def is_clean(slot):
    """Whether a call left anything behind in its slot (most do not): then the slot needs no wipe."""
    try:
        return left_as_found(slot_dir(slot)) and not (slot_uid(slot) and SHM and not shm_empty())
    except OSError:
        return False


def wipe(slot):
    """Empties a slot's scratch dir and its uid's files in /dev/shm. Runs in the wiper's process (Wiper) once
    the zygote has reported the slot's processes dead, before the slot is given out again. Never raises: a wipe
    that fails is logged and the slot is used as it is."""
    d = slot_dir(slot)
    uid = slot_uid(slot)
    try:
        if not left_as_found(d):
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                left = clear_dir(fd)
            finally:
                os.close(fd)
            if left:
                log(f"wipe of slot {slot}: {left} entries could not be removed")
            os.chmod(d, SLOT_MODE)  # without slot uids its owner may have changed it
            if d not in EMPTY_SIZE:
                learn_empty_size(d)
        if uid and SHM and not shm_empty():
            with os.scandir(SHM) as it:
                for e in it:
                    try:
                        if e.stat(follow_symlinks=False).st_uid == uid:
                            os.unlink(e.path)
                    except OSError:
                        pass
    except Exception as ex:  # noqa: BLE001 - nothing a snippet left behind may end the sandbox
        log(f"wipe of slot {slot} failed: {ex!r}")


class Wiper:
    """Wipes slots in a process of its own, forked before any request exists, so a slot holding 100k files
    delays only its own reuse, not every other call's answer. (A thread was tried: its Python loop held the
    GIL, and each of the broker's system calls then waited up to 5 ms to get it back.) Slot numbers go to it
    on one pipe and come back, wiped, on another, which the broker's selector watches."""

    def __init__(self):
        todo_r, self.todo_w = os.pipe()
        self.r, done_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(self.todo_w)
                os.close(self.r)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)  # Node's pipes stay the broker's alone
                os.dup2(null, 1)
                zygote.libc.prctl(zygote.PR_SET_PDEATHSIG, 9, 0, 0, 0)
                # A session of its own: with autogroups the scheduler shares the CPU between sessions, and a
                # long wipe in the broker's session took half its share from the broker and zygote, which
                # every call waits on (innocent calls' p99 in a slot next to 1,100-deep dirs: 14-16 -> 10-11 ms)
                os.setsid()
                while True:
                    data = os.read(todo_r, 2)
                    if len(data) < 2:
                        break
                    (slot,) = struct.unpack("<H", data)
                    wipe(slot)
                    os.write(done_w, data)
            finally:
                os._exit(0)
        os.close(todo_r)
        os.close(done_w)
        os.set_blocking(self.r, False)

    def put(self, slot):
        os.write(self.todo_w, struct.pack("<H", slot))

    def done(self):
        """Slots wiped since the last call."""
        try:
            data = os.read(self.r, 1 << 16)
        except BlockingIOError:
            return []
        if not data:  # slots it held would never come back: restart the sandbox as for a dead zygote
            log("wiper died")
            os._exit(4)
        return [x for (x,) in struct.iter_unpack("<H", data)]


def slot_memory_kb(base_kb, every=()):
    """Memory each slot's calls hold now, by slot uid: every process's resident anonymous memory, less what it
    inherited from the zygote (base_kb, shared copy-on-write by all), and its resident shared memory (shared
    anonymous mappings, mapped tmpfs files: RssShmem, which RssAnon leaves out, so 4 forks held 3.5 GB under a
    128 MB limit, issue 42), plus the uid's files in /dev/shm; the latter alone; and the lowest pid of each slot's
    processes (its call's own, as a rule). RLIMIT_AS bounds one process; this bounds them all. Pages a snippet's
    own forks share count once per process, and a mapped /dev/shm file twice, so the sum errs high, never low.
    Also how many processes each slot has, and the pids of each slot in `every`. Needs per-slot uids (root)."""
    used = {}
    shm = {}
    pids = {}
    procs = {}
    found = {slot: [] for slot in every}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                uid = anon = None
                shmem = 0
                for line in f:
                    if line.startswith(b"Uid:"):
                        uid = int(line.split()[1])
                    elif line.startswith(b"RssAnon:"):
                        anon = int(line.split()[1])
                    elif line.startswith(b"RssShmem:"):
                        shmem = int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
        slot = (uid or 0) - UID_BASE
        if anon is not None and 0 <= slot < SLOTS:
            used[slot] = used.get(slot, 0) + max(0, anon - base_kb) + shmem
            pids[slot] = min(pids.get(slot, 1 << 30), int(name))
            procs[slot] = procs.get(slot, 0) + 1
            if slot in found:
                found[slot].append(int(name))
    if SHM and not shm_empty():
        with os.scandir(SHM) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                slot = st.st_uid - UID_BASE
                if 0 <= slot < SLOTS:
                    used[slot] = used.get(slot, 0) + st.st_blocks // 2
                    shm[slot] = shm.get(slot, 0) + st.st_blocks // 2
    return used, shm, pids, procs, found


def read_int(path, default):
    try:
        with open(path, "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return default


# What one AF_UNIX socket can pin, in KB (issue 42, break 3): the queue of a stream or seqpacket socket holds what its
# one peer has sent and it has not read, less than the peer's send buffer plus one message (2 x wmem_default, as
# raising SO_SNDBUF is refused: seccomp_filter.py), and stays when the peer closes; a datagram socket's holds up to
# max_dgram_qlen + 1 datagrams from others (each below a send buffer) and its connected peer's 2 x; each connection
# waiting on a listener, 2 x. Read here, in the sandbox's network namespace (max_dgram_qlen is per namespace).
SOCK_WMEM_KB = read_int("/proc/sys/net/core/wmem_default", 212992) // 1024
SOCK_KB = {1: 2 * SOCK_WMEM_KB, 5: 2 * SOCK_WMEM_KB,  # SOCK_STREAM, SOCK_SEQPACKET
           2: (read_int("/proc/sys/net/unix/max_dgram_qlen", 10) + 3) * SOCK_WMEM_KB}  # SOCK_DGRAM
# sock_diag dump of every AF_UNIX socket in the namespace (nlmsghdr: SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP;
# unix_diag_req: AF_UNIX, all states, UDIAG_SHOW_RQLEN | UDIAG_SHOW_UID)
DIAG_REQ = struct.pack("<IHHII", 40, 20, 0x301, 1, 0) + struct.pack("<BBHIIIII", 1, 0, 0, 0xFFFFFFFF, 0, 0x50, 0, 0)
UNIX_DIAG_RQLEN, UNIX_DIAG_UID, TCP_LISTEN = 4, 7, 10


def socket_memory_kb():
    """What each slot's sockets can pin in their queues, by slot uid (the socket's owner): SOCK_KB per socket, and per
    connection waiting on a listener. Unread socket buffers are kernel memory in no process's RSS: 8 forks held 208 MB
    there under a 128 MB limit (issue 42). Each live socket is counted (open, or in flight in another's queue), at what
    it can hold rather than what it holds now: a sender that closed leaves its bytes behind, in a queue whose reported
    length counts bytes, not the ~768 bytes of kernel memory each 1-byte message takes."""
    out = {}
    if SOCK_DIAG is None:
        return out
    try:
        SOCK_DIAG.send(DIAG_REQ)
        while True:
            data = SOCK_DIAG.recv(1 << 16)
            pos = 0
            while pos + 16 <= len(data):
                ln, kind = struct.unpack_from("<IH", data, pos)
                if kind == 3 or kind == 2 or ln < 16:  # NLMSG_DONE, NLMSG_ERROR
                    return out
                typ, state = data[pos + 17], data[pos + 18]
                a, end = pos + 32, pos + ln
                uid = pending = None
                while a + 4 <= end:
                    alen, atype = struct.unpack_from("<HH", data, a)
                    if atype == UNIX_DIAG_UID:
                        uid = struct.unpack_from("<I", data, a + 4)[0]
                    elif atype == UNIX_DIAG_RQLEN:
                        pending = struct.unpack_from("<I", data, a + 4)[0]
                    a += (alen + 3) & ~3 or 4
                pos += (ln + 3) & ~3
                slot = (uid if uid is not None else -1) - UID_BASE
                if 0 <= slot < SLOTS:
                    kb = SOCK_KB.get(typ, 2 * SOCK_WMEM_KB)
                    if state == TCP_LISTEN:
                        kb *= 1 + (pending or 0)
                    out[slot] = out.get(slot, 0) + kb
    except OSError as e:
        log(f"sock_diag: {e}")
    return out


def scratch_usage(slot):
    """Entries and KB under a slot's scratch dir (isolation landlock). Stops counting past SCRATCH_FILES; a directory
    nested deeper than SCRATCH_DEPTH makes the count -1. Never follows a link; what vanishes meanwhile is skipped."""
    found = [0, 0]

    def walk(fd, depth):
        with os.scandir(fd) as it:
            for e in it:
                found[0] += 1
                if found[0] > SCRATCH_FILES:
                    return
                try:
                    found[1] += e.stat(follow_symlinks=False).st_blocks // 2
                    if not e.is_dir(follow_symlinks=False):
                        continue
                    if depth == SCRATCH_DEPTH:
                        found[0] = -1
                        return
                    sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError:
                    continue
                try:
                    walk(sub, depth + 1)
                finally:
                    os.close(sub)
                if found[0] < 0 or found[0] > SCRATCH_FILES:
                    return

    try:
        root = os.open(slot_dir(slot), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0, 0
    try:
        walk(root, 1)
    except OSError:
        pass
    finally:
        os.close(root)
    return found[0], found[1]


def scratch_files(slot):
    """Inodes in use in a slot's scratch tmpfs, less its root."""
    try:
        st = os.statvfs(slot_dir(slot))
    except OSError:
        return 0
    return max(0, st.f_files - st.f_ffree - 1)


# --------------------------------------------------------------------------------------- broker --
class Call:
    __slots__ = ("id", "slot", "rid", "out", "err", "res", "nout", "nerr", "open", "result", "killed", "held",
                 "sess", "t0", "deadline", "flush_at", "lost", "stdin", "fetch", "answered", "reaped", "mem_kb",
                 "used_kb", "files", "shm_kb", "demoted", "req", "disk_kb", "pid", "walked", "sock_kb", "cpu0",
                 "report", "cg_oom")

    def __init__(self, cid, slot, rid, sess=None):
        self.id, self.slot, self.rid = cid, slot, rid
        self.out, self.err = bytearray(), bytearray()
        self.res = None
        self.nout = self.nerr = 0
        self.open = 2
        self.result = None
        self.killed = self.held = self.cg_oom = False
        self.demoted = False
        self.sess = sess
        self.t0 = 0.0
        self.deadline = self.flush_at = INF
        self.lost = None
        self.stdin = -1
        self.fetch = self.answered = self.reaped = False
        self.mem_kb = self.used_kb = self.shm_kb = self.files = self.disk_kb = self.sock_kb = 0
        self.req = None  # the request as queued, to queue it again if its process could not be forked
        self.pid = 0  # the child's, from the head of its result pipe (take_exit_report)
        self.report = None  # its EXIT report, once read (maybe_finish)
        self.walked = None  # (entries, KB) its scratch held at the last walk (isolation landlock; check_memory)
        self.cpu0 = 0.0  # CPU seconds its processes had run before it began (a session cell's: see demote)


class Sess:
    __slots__ = ("sid", "slot", "rid", "sock", "call", "err", "closed", "demoted", "autogroup", "pid", "pidfd",
                 "strikes", "stopped", "done_at")

    def __init__(self, sid, slot, rid, sock):
        self.sid, self.slot, self.rid, self.sock = sid, slot, rid, sock
        self.call = None
        self.err = ""
        self.closed = self.demoted = False
        self.autogroup = (0, 0)  # the pid its session's nice was last written through, and that nice
        self.pid = 0  # its process's, as it said before running any code (the first "P")
        self.pidfd = -1  # and a pidfd for it, through which it is stopped and continued (Broker.signal_session)
        self.strikes = 0  # checks in a row that found it running between its cells (Broker.check_between)
        self.stopped = False  # sent SIGSTOP since its last cell
        self.done_at = 0.0  # when its last cell ended


class Broker:
    def __init__(self):
        self.wiper = Wiper()  # first: it must hold no copy of the zygote's socket
        self.zpid, self.z = start_zygote()
        self.ep = select.epoll()
        self.watched = {}  # fd -> (what it is, its Call or Sess or pending stdin bytes)
        self.inbuf = bytearray()
        # reused for every read: a fresh 1 MiB bytes per read was an mmap, page faults and an munmap
        self.rbuf = bytearray(1 << 20)
        self.rview = memoryview(self.rbuf)
        self.waiting = []
        self.free = list(range(SLOTS - SESSION_SLOTS - 1, -1, -1))
        self.sess_free = list(range(SLOTS - 1, SLOTS - SESSION_SLOTS - 1, -1))
        self.sessions = {}  # sid -> Sess
        self.sess_by_rid = {}
        self.sess_waiting = []  # (cid, timeout_ms, flags, sid, payload) not started yet
        self.calls = {}  # rid -> Call (stateless)
        self.spares = []  # Calls of pre-forked children waiting, confined, for a request
        self.timed = set()  # Calls with a running wall clock
        self.exit_wait = set()  # Calls whose EXIT report came before their process was seen exiting (maybe_finish)
        self.autogroup_want = {}  # Call -> its session's nice, to write (set_autogroups)
        self.dirty = []  # slots whose call has ended, to be wiped before they are given out again
        self.spare_deaths = 0
        self.spawn_retry = 0.0  # after a failed fork: no new process is asked for before this time (0: none)
        self.spawn_since = {}  # request id -> when its first try to fork failed
        self.procs_kill = 0  # rid of the call killed to free processes, until the zygote reports it gone
        self.procs = {}  # slot -> its processes, as the last memory check counted them
        self.slot_pids = {}  # slot -> its pids at the last memory check, for slots watched then (check_memory)
        self.pids_at = 0.0  # when that check listed them
        self.leftovers = set()  # sessions whose last cell may have left processes running (kill_leftovers)
        self.between = set()  # sessions between cells, stopped (check_between)
        self.spawn_logged = -INF
        self.prefork = PREFORK
        self.rid = 0
        self.outq = []
        self.null = os.open(os.devnull, os.O_WRONLY)  # where output past maxOutputBytes is spliced
        self.paused = {}  # fd -> (which, call, when it is read again): output past maxOutputBytes (pause)
        self.base_kb = 0
        self.own_scratch = False
        self.next_mem_check = 0.0
        self.walk_due = 0.0  # when the scratch dirs on the host disk are listed again (check_memory)

    def watch(self, fd, data, events=select.EPOLLIN):
        """epoll itself, not selectors, whose Python bookkeeping per event led the broker's CPU profile."""
        self.ep.register(fd, events)
        self.watched[fd] = data

    def unwatch(self, fd):
        del self.watched[fd]
        try:
            self.ep.unregister(fd)
        except OSError:
            pass  # closed already, which removed it from the epoll set

    def next_rid(self):
        self.rid = (self.rid + 1) & 0xFFFFFFFF or 1
        return self.rid

    def send(self, cid, hdr, out=b"", err=b""):
        h = json.dumps(hdr, separators=(",", ":")).encode()
        frame = struct.pack("<III", 8 + len(h) + len(out) + len(err), cid, len(h)) + h + out + err
        self.outq.append(frame)

    def flush(self):
        if not self.outq:
            return
        data = b"".join(self.outq)
        self.outq.clear()
        view = memoryview(data)
        while view:
            try:
                n = os.write(1, view)
                view = view[n:]
            except BlockingIOError:
                select.select([], [1], [])
            except BrokenPipeError:
                os._exit(0)

    def start(self):
        msg = self.z.recv(65536)
        if not msg or msg[0:1] != b"Y":
            log("zygote did not start")
            os._exit(3)
        info = json.loads(msg[1:])
        self.base_kb = int(info.get("anonKb", 0))
        info["ready"] = True
        # what demotion will do here: nothing without per-slot uids; with autogroups, the session's weight too
        info["demoteAfterMs"] = round(DEMOTE_S * 1000) if UID_BASE else 0
        info["demoteSession"] = bool(UID_BASE and AUTOGROUP)
        info["limits"] = LIMITS
        if SHM:
            learn_empty_size(SHM)
        for slot in range(SLOTS):  # the zygote made them, empty; wipes happen in the wiper's process
            learn_empty_size(slot_dir(slot))
        # under bubblewrap each slot's scratch is its own tmpfs, whose inode count is that slot's alone
        self.own_scratch = all(os.path.ismount(slot_dir(slot)) for slot in range(SLOTS))
        self.send(0, info)
        self.flush()
        os.set_blocking(0, False)
        self.watch(0, ("node", None))
        self.watch(self.z.fileno(), ("zygote", None))
        self.watch(self.wiper.r, ("wiped", None))
        self.refill()  # spares for the first requests

    def on_node(self):
        try:
            n = os.readv(0, [self.rbuf])
        except BlockingIOError:
            return
        if not n:  # Node closed the pipe: shut down; the zygote kills its children
            os._exit(0)
        self.inbuf += self.rview[:n]
        buf = self.inbuf
        pos = 0
        while len(buf) - pos >= 16:
            (n,) = struct.unpack_from("<I", buf, pos)
            if len(buf) - pos < 4 + n:
                break
            cid, timeout_ms, mem_mb = struct.unpack_from("<III", buf, pos + 4)  # mem_mb carries the flags
            if mem_mb & (FLAG_SESSION | FLAG_CLOSE):
                (sid,) = struct.unpack_from("<I", buf, pos + 16)
                if mem_mb & FLAG_CLOSE:
                    self.close_session(sid)
                else:
                    self.sess_waiting.append((cid, timeout_ms, mem_mb, sid, bytes(buf[pos + 20:pos + 4 + n])))
            else:
                self.waiting.append((cid, timeout_ms, mem_mb, bytes(buf[pos + 16:pos + 4 + n])))
            pos += 4 + n
        if pos:
            del buf[:pos]
        self.dispatch()
        self.dispatch_sessions()

    def open_call(self, call, result_pipe):
        """Pipes for one call; returns the child's ends (stdin, stdout, stderr[, result]); our stdin end is
        call.stdin, our result end call.res."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child_fds = [in_r, out_w, err_w]
        if result_pipe:
            res_r, res_w = os.pipe()
            child_fds.append(res_w)
            call.res = res_r  # read once the child has its request (arm_result)
            nonblocking(res_r)
        nonblocking(out_r)
        nonblocking(err_r)
        self.watch(out_r, ("out", call))
        self.watch(err_r, ("err", call))
        nonblocking(in_w)
        call.stdin = in_w
        return child_fds

    def fork_child(self, call):
        child_fds = self.open_call(call, True)  # used if the call fetches files or reports its exit
        socket.send_fds(self.z, [b"R" + ZRUN.pack(call.rid, 0, call.slot)], child_fds)
        for fd in child_fds:
            os.close(fd)

    def arm_result(self, call, used):
        """Our end of the call's result pipe, if it has one, is read from now on, or closed if not used."""
        if call.res is None:
            return
        if used:
            self.watch(call.res, ("res", call))
            call.res, call.open = bytearray(), 3
        else:
            os.close(call.res)
            call.res = None

    def begin(self, call, cid, timeout_ms, mem_mb, payload):
        """Hands a request to its (already forked) child: limits, then the payload, on its stdin."""
        call.id = cid
        call.req = (cid, timeout_ms, mem_mb, payload)
        self.start_clock(call, timeout_ms)
        call.mem_kb = (mem_mb & ~FLAGS) << 10
        if CG:  # before the child reads its request: from its first line on, the kernel holds it to the limit
            CG.start(call.slot, mem_mb & ~FLAGS)
        call.fetch = bool(mem_mb & FLAG_FETCH)
        if not self.waiting:  # latency matters more than the child's cost of reporting its own exit
            mem_mb |= FLAG_REPORT
        self.arm_result(call, mem_mb & (FLAG_FETCH | FLAG_REPORT))
        self.write_stdin(call.stdin, memoryview(LIM.pack(timeout_ms, mem_mb) + payload))

    def dispatch(self):
        while self.waiting and (self.spares or self.free and not self.spawn_retry):
            cid, timeout_ms, mem_mb, payload = self.waiting.pop(0)
            if self.spares:
                call = self.spares.pop(0)  # the oldest spare: the newest may still be setting up
            else:
                call = Call(None, self.free.pop(), self.next_rid())
                self.calls[call.rid] = call
                self.fork_child(call)
            self.begin(call, cid, timeout_ms, mem_mb, payload)

    def refill(self):
        """Slots nobody waits for get a spare: fork and confinement then happen before the next request, not
        on its latency. A spare that dies unused three times in a row turns this off (a broken setup)."""
        while self.prefork and not self.spawn_retry and not self.waiting and self.free:
            call = Call(None, self.free.pop(), self.next_rid())
            self.calls[call.rid] = call
            self.spares.append(call)
            self.fork_child(call)

    # ------------------------------------------------------------------------------ sessions --
    def dispatch_sessions(self):
        keep = []
        for item in self.sess_waiting:
            cid, timeout_ms, mem_mb, sid, payload = item
            s = self.sessions.get(sid)
            if s is None:
                # a closed session's slot is still being swept, or the zygote's last fork failed (spawn_failed)
                if not self.sess_free or self.spawn_retry:
                    keep.append(item)
                    continue
                s = self.new_session(sid, mem_mb & ~FLAGS)
            if s.call is not None:  # Node sends one call per session at a time; keep order anyway
                keep.append(item)
                continue
            self.start_cell(s, cid, timeout_ms, mem_mb, payload)
        self.sess_waiting = keep

    def new_session(self, sid, mem_mb):
        slot = self.sess_free.pop()
        rid = self.next_rid()
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        socket.send_fds(self.z, [b"S" + ZRUN.pack(rid, mem_mb, slot)], [b.fileno()])
        b.close()
        s = Sess(sid, slot, rid, a)
        self.sessions[sid] = s
        self.sess_by_rid[rid] = s
        self.watch(a.fileno(), ("sess", s))
        return s

    def start_cell(self, s, cid, timeout_ms, mem_mb, payload):
        call = Call(cid, s.slot, s.rid, s)
        if s in self.between:
            self.between.discard(s)
            if s.stopped:
                s.stopped = False
                self.signal_session(s, signal.SIGCONT)
        call.req = (cid, timeout_ms, mem_mb, s.sid, payload)
        if s.demoted:  # the previous cell ran long: this one starts at the priority of a fresh call
            s.demoted = False
            self.renice(s.slot, BASE_NICE)
        call.cpu0 = None  # its process's CPU so far, taken once the cell is DEMOTE_S old (demote)
        if AUTOGROUP and s.autogroup[1] and not self.set_autogroup(call, s.autogroup[0], 0):
            self.autogroup_want[call] = 0
        self.start_clock(call, timeout_ms)
        call.mem_kb = (mem_mb & ~FLAGS) << 10
        if CG:
            CG.start(s.slot, mem_mb & ~FLAGS)
        s.call = call
        call.fetch = bool(mem_mb & FLAG_FETCH)
        child_fds = self.open_call(call, call.fetch)
        self.arm_result(call, True)
        try:
            socket.send_fds(s.sock, [struct.pack("<I", timeout_ms)], child_fds)
        except OSError:
            pass  # the session process is gone; the zygote's report answers the call
        for fd in child_fds:
            os.close(fd)
        self.write_stdin(call.stdin, memoryview(payload))

    def close_session(self, sid):
        s = self.sessions.get(sid)
        if s is None:
            keep = []
            for item in self.sess_waiting:  # not started yet: answer without creating it
                if item[3] == sid:
                    self.send(item[0], {"c": None, "g": None, "r": REASON_CLOSED, "w": 0, "u": 0, "m": 0,
                                        "l": 0, "no": 0, "ne": 0, "o": 0, "e": 0, "sl": "session closed"})
                else:
                    keep.append(item)
            self.sess_waiting = keep
            return
        if not s.closed:
            s.closed = True
            if s.call is not None:
                s.call.killed = True
            self.z.send(b"K" + ZKILL.pack(s.rid, REASON_CLOSED))

    def on_sess(self, s):
        try:
            msg = s.sock.recv(4096)
        except OSError:
            msg = b""
        if not msg:  # the process is gone; the zygote reports how, then session_died runs
            self.unwatch(s.sock.fileno())
            return
        if msg[0:1] == b"E":
            s.err = msg[1:].decode("utf-8", "replace")
            return
        if msg[0:1] == b"P":
            if not s.pid and len(msg) == 5:  # the first is the session's, sent before any cell; later ones forged
                s.pid = struct.unpack_from("<I", msg, 1)[0]
                try:
                    s.pidfd = os.pidfd_open(s.pid)
                except OSError:
                    pass  # gone already, or no pidfds (Linux < 5.3): signalled by pid
            return
        call = s.call
        if msg[0:1] != b"D" or call is None or call.killed:
            return
        rc, cpu_us, rss = SDONE.unpack_from(msg, 1)
        s.call = None
        # Stopped until its next cell by the next check (check_between): the snippet runs in this process and can send
        # this "D" itself, then run on outside every clock and memory check (issue 42, break 2), as can a thread it
        # left; stopped, it runs no code. At the check, not now, so a session called back to back pays nothing
        self.between.add(s)
        s.done_at = time.monotonic()
        if UID_BASE:
            self.leftovers.add(s)
        self.timed.discard(call)
        call.result = (s.rid, rc, 0, REASON_NONE, self.wall_us(call), cpu_us, rss, 0)
        self.drain(call)
        self.maybe_finish(call)
        self.dispatch_sessions()

    def session_died(self, s, res):
        self.leftovers.discard(s)  # its slot may soon be another session's
        self.between.discard(s)
        if s.pidfd >= 0:
            os.close(s.pidfd)
        del self.sessions[s.sid]
        del self.sess_by_rid[s.rid]
        if s.sock.fileno() in self.watched:
            self.unwatch(s.sock.fileno())
        s.sock.close()
        self.dirty.append(s.slot)
        _, code, sig, reason, _, rss, leftovers = res
        if CG and reason == REASON_NONE and (s.call is not None and s.call.cg_oom or CG.oom_since(s.slot, sig == 9)):
            reason = REASON_MEMORY
            if s.call is not None:
                s.call.cg_oom = True
        if reason == REASON_TIMEOUT:
            why = "session killed: a call ran past its time limit"
        elif reason == REASON_OUTPUT:
            why = "session killed: a call passed the output limit"
        elif reason == REASON_MEMORY:
            why = "session killed: its processes together passed the memory limit"
        elif reason == REASON_CLOSED:
            why = "session closed"
        elif reason == REASON_PROCS:
            why = f"session killed: {PROCS_WHY}"
        elif reason == REASON_BETWEEN:
            why = "session killed: its process ran between its calls"
        elif sig:
            why = f"session process killed by signal {sig}"
        else:
            why = f"session process exited with code {code}"
        if s.err:
            why += f" ({s.err})"
        call = s.call
        if call is not None:
            s.call = None
            self.timed.discard(call)
            call.result = (s.rid, code, sig, reason, self.wall_us(call), 0, rss, leftovers)
            call.lost = why
            self.drain(call)
            self.maybe_finish(call)
        elif not s.closed:
            self.send(0, {"sessionGone": s.sid, "why": why})
        self.dispatch_sessions()

    def start_clock(self, call, timeout_ms):
        call.t0 = time.monotonic()
        # a request retried after a failed fork (spawn_failed) has its time limit from its first try, as Node's
        # watchdog counts it
        start = self.spawn_since.get(call.id, call.t0) if self.spawn_since else call.t0
        call.deadline = start + timeout_ms / 1000.0
        call.flush_at = call.deadline - min(FLUSH_MARGIN_S, timeout_ms / 2000.0)
        self.timed.add(call)

    @staticmethod
    def wall_us(call):
        return int((time.monotonic() - call.t0) * 1e6) if call.t0 else 0

    def check_deadlines(self):
        """Wall-clock limits, kept here rather than in the zygote, whose every step after a fork costs
        copy-on-write faults. A call near its deadline is told to flush its output (FLUSH_MARGIN_S), one past it
        is killed with reason timeout (a session with its whole process). Returns seconds until the next deadline,
        or None."""
        nearest = INF
        now = time.monotonic()
        if self.exit_wait:
            waiting, self.exit_wait = self.exit_wait, set()
            for call in waiting:
                self.maybe_finish(call)
            if self.exit_wait:
                nearest = now + EXIT_POLL_S
        for call in list(self.timed):
            if call.killed:
                self.timed.discard(call)
            elif now >= call.flush_at:
                if now >= call.deadline:
                    self.kill(call, REASON_TIMEOUT)
                else:
                    call.flush_at = call.deadline  # next: the kill
                    self.z.send(b"F" + ZKILL.pack(call.rid, REASON_NONE))
                    nearest = min(nearest, call.deadline)
            elif call.flush_at < nearest:
                nearest = call.flush_at
        checked = UID_BASE and (self.timed or self.leftovers)
        if checked or self.between:
            if now >= self.next_mem_check:
                if checked:
                    self.check_memory()
                self.check_between(now)
                self.next_mem_check = now + MEM_CHECK_S
            nearest = min(nearest, self.next_mem_check)
        if checked and DEMOTE_S:
            nearest = min(nearest, self.demote(now))
        if self.paused:
            nearest = min(nearest, self.resume(now))
        if self.spawn_retry:
            nearest = min(nearest, self.spawn_retry)
        return None if nearest == INF else max(0.0, nearest - now)

    def demote(self, now):
        """A call that has run DEMOTE_S and used DEMOTE_CPU_S of CPU gets nice 19 for all its processes (children
        forked later inherit it), so under contention the kernel gives the CPU to calls that have just started: a
        busy loop or a fork bomb next to them costs an innocent call little, and alone a long call runs as fast as
        before. The CPU, because on a host loaded by other work a trivial call waiting for a core outlived 50 ms,
        was demoted with the hogs, and then waited at nice 19 (trivial calls beside 10 busy loops, each past the
        mark: p99 0.55-0.58 s, against 16-20 ms with CPU counted); a tenth of the wall time, not all of it, because
        a hog on such a host computes for a small share of its time too. A call asleep is not demoted; a session
        cell is once it has used DEMOTE_CPU_S more after its first DEMOTE_S. Its slot's
        next call is forked from the zygote at its nice; a session's process is reset when its next cell starts.
        With autogroups nice only ranks the tasks of one session, so the call's session gets nice 19 as well.
        Returns when the next call is due to be looked at."""
        due = INF
        lower = False
        listed = False
        for call in list(self.timed):  # a memory check below may end calls
            if call.demoted or call.killed:
                continue
            if now - call.t0 < DEMOTE_S:  # not before, whatever it has used
                due = min(due, call.t0 + DEMOTE_S)
                continue
            if self.pids_at < call.t0 and not listed:
                # its forks are not listed yet, and they may be what computes (a parent waiting on a pool): a
                # memory check now, at most one per pass, rather than up to MEM_CHECK_S later
                listed = True
                self.check_memory()
                self.next_mem_check = time.monotonic() + MEM_CHECK_S
                if call.killed:
                    continue
            # its own process and those the last memory check saw in its slot, if that was since the call began
            pids = set(self.slot_pids.get(call.slot, ())) if self.pids_at >= call.t0 else set()
            pids.add(call.sess.pid if call.sess else self.take_pid(call))
            pids.discard(0)
            if call.cpu0 is None:
                # a session cell: its process has run earlier cells, so what it uses from now on counts. Taken here,
                # not as the cell starts, where the read cost every cell ~5 % of the session rate
                call.cpu0 = cpu_s(pids)
                due = min(due, now + DEMOTE_CPU_S)
                continue
            used = cpu_s(pids, call.cpu0 + DEMOTE_CPU_S) - call.cpu0
            if used < DEMOTE_CPU_S:
                due = min(due, now + max(DEMOTE_CPU_S - used, 0.01))
                continue
            call.demoted = True
            if call.sess:
                call.sess.demoted = True
            self.renice(call.slot, 19)
            # flushed and line-buffered now, while it has the rest of its time to get a CPU: at nice 19 beside
            # busy work (with autogroups, a session of weight 15 against 1024) a busy loop ran no bytecode in the
            # 100 ms before its deadline, and what it had printed was lost with it
            self.z.send(b"F" + ZKILL.pack(call.rid, REASON_NONE))
            if AUTOGROUP:
                self.autogroup_want[call] = 19
                lower = True
        if lower:  # now rather than at the next check, which finds the pids to write through
            self.check_memory()
            self.next_mem_check = now + MEM_CHECK_S
        return due

    def kill(self, call, reason):
        """Has the zygote kill a call and all its processes; it is answered, and its slot freed, once they are all
        reaped. A demoted one is put back to the weight of a fresh call: a killed process still needs CPU to exit,
        and at nice 19, in a session of weight 15 beside busy work, a fork bomb's forks took seconds to end while
        the slots filled with them, until no call was answered and Node's watchdog restarted the sandbox."""
        call.killed = True
        self.timed.discard(call)
        self.z.send(b"K" + ZKILL.pack(call.rid, reason))
        if call.demoted:
            self.renice(call.slot, BASE_NICE)
            if AUTOGROUP:
                self.autogroup_want[call] = 0

    @staticmethod
    def renice(slot, nice):
        try:
            os.setpriority(os.PRIO_USER, slot_uid(slot), nice)
        except ProcessLookupError:
            pass  # the call's processes are all gone already
        except OSError as e:  # no CAP_SYS_NICE (an older launcher): scheduling is only less fair
            log(f"renice slot {slot}: {e}")

    def set_autogroups(self, pids):
        """Writes each wanted session weight (the nice of the call's autogroup, which all its processes share), oldest
        first; one refused for the kernel's rate limit waits for the next memory check, one for a call that has
        ended is dropped."""
        for call, nice in list(self.autogroup_want.items()):
            # a killed call's processes are put back while they die: until the zygote's report, its slot is its own
            dying = call.killed and nice == 0 and (
                self.calls.get(call.rid) is call if call.sess is None else self.sess_by_rid.get(call.rid) is call.sess)
            if call not in self.timed and not dying:
                del self.autogroup_want[call]
            elif call.slot in pids:
                done = self.set_autogroup(call, pids[call.slot], nice)
                if done is None:
                    return
                if done:
                    del self.autogroup_want[call]

    def set_autogroup(self, call, pid, nice):
        """True once written, False if pid has just ended, None when the kernel refuses for now: it takes one such
        write per 100 ms host-wide from a process without CAP_SYS_ADMIN."""
        global AUTOGROUP
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(nice))
        except BlockingIOError:
            return None
        except (FileNotFoundError, ProcessLookupError):
            return False
        except OSError as e:
            log(f"no session weights for long calls ({e}): with autogroups they share the CPU as equals")
            AUTOGROUP = False
            self.autogroup_want.clear()
            return None
        if call.sess:
            call.sess.autogroup = (pid, nice)
        return True

    def kill_leftovers(self, idle, found):
        """Between its cells a session's slot holds its process alone: what a cell forked and left running is
        killed here (at most MEM_CHECK_S after the cell), before the memory check stopped looking at it and 605 MB
        lived on uncounted (issue 42). While a cell runs, the slot's processes count against that cell's limit."""
        for s in list(self.leftovers):
            if s.slot not in idle:
                continue  # a cell is running: its memory check counts them
            rest = [p for p in found.get(s.slot, ()) if p != s.pid]
            if not rest:
                self.leftovers.discard(s)
            for p in rest:
                try:
                    os.kill(p, 9)
                except OSError:
                    pass  # gone meanwhile
            if rest:  # one of them may have continued it
                s.stopped = True
                self.signal_session(s, signal.SIGSTOP)

    @staticmethod
    def signal_session(s, sig):
        try:
            if s.pidfd >= 0:
                signal.pidfd_send_signal(s.pidfd, sig)
            elif s.pid:
                os.kill(s.pid, sig)
        except OSError:
            pass  # it has exited: the zygote's report follows

    def check_between(self, now):
        """A session between cells is stopped by the first check at least MEM_CHECK_S after its cell (so 0.1-0.2 s
        after it; a session called back to back is never stopped) and must stay so, once no other process of its slot
        is left to continue it (kill_leftovers): one found running at two checks in a row is killed. Its filter refuses
        what would continue it again and again (timer_create, F_SETSIG: seccomp_filter.py) or once a child is killed
        (a SIGCONT exit signal); what is left continues it once (an orphaned process group, a terminal's hangup),
        after which it is stopped again or killed."""
        for s in list(self.between):
            if s in self.leftovers or s.closed or not s.pid:
                continue
            if not s.stopped:
                if now - s.done_at >= MEM_CHECK_S:
                    s.stopped = True
                    self.signal_session(s, signal.SIGSTOP)
                continue
            f = stat_fields(s.pid)
            if f is None:
                continue  # exited: the zygote's report follows
            if f[0] == b"T":
                s.strikes = 0
                continue
            s.strikes += 1
            if s.strikes < 2:
                self.signal_session(s, signal.SIGSTOP)
                continue
            self.between.discard(s)  # its death is reported as sessionGone, with the reason
            self.z.send(b"K" + ZKILL.pack(s.rid, REASON_BETWEEN))

    def check_memory(self):
        """A call whose processes hold more than its memory limit together is killed with reason memory (a
        session with its whole process)."""
        self.leftovers = {s for s in self.leftovers if self.sessions.get(s.sid) is s and not s.closed}
        idle = {s.slot: s for s in self.leftovers if s.call is None and s.pid}
        # and the pids of the calls not yet demoted, whose CPU demote() counts
        watch = idle.keys() | {c.slot for c in self.timed if not c.demoted} if DEMOTE_S else idle
        self.pids_at = time.monotonic()
        used, shm, pids, self.procs, self.slot_pids = slot_memory_kb(self.base_kb, watch)
        sock = socket_memory_kb() if self.timed else {}
        self.kill_leftovers(idle, self.slot_pids)
        if self.autogroup_want and AUTOGROUP:
            self.set_autogroups(pids)
        now = time.monotonic()
        walk = now >= self.walk_due
        walked = 0.0
        for call in list(self.timed):
            if CG and not call.killed and CG.oom_since(call.slot):  # the kernel stopped one of its processes
                call.killed = call.cg_oom = True
                self.kill(call, REASON_MEMORY)
                continue
            kb = used.get(call.slot, 0) + sock.get(call.slot, 0)
            over_shm = SHM_SLOT_KB and shm.get(call.slot, 0) > SHM_SLOT_KB
            disk_kb = 0
            if self.own_scratch:
                files = scratch_files(call.slot)
            elif SCRATCH_KB:
                if walk or call.walked is None:  # a new call's scratch is empty: cheap to walk at once
                    t0 = time.monotonic()
                    call.walked = scratch_usage(call.slot)
                    walked += time.monotonic() - t0
                files, disk_kb = call.walked
            else:
                files = 0
            over_files = SCRATCH_FILES and (files > SCRATCH_FILES or files < 0)
            over_disk = SCRATCH_KB and disk_kb > SCRATCH_KB
            if (over_shm or over_files or over_disk or call.mem_kb and kb > call.mem_kb) and not call.killed:
                call.killed = True
                call.used_kb, call.shm_kb, call.sock_kb = kb, shm.get(call.slot, 0), sock.get(call.slot, 0)
                call.files = files if over_files else 0
                call.disk_kb = disk_kb if over_disk else 0
                self.kill(call, REASON_MEMORY)
        if walk:
            # the walks of one round take at most WALK_SHARE of a core over time: three calls sitting on ~10,000
            # files each made them take 60 % of one every 100 ms (issue 42); a file or disk limit passed is then
            # seen up to walked / WALK_SHARE later
            self.walk_due = now + walked / WALK_SHARE

    # ---------------------------------------------------------------------------------- pipes --
    def write_stdin(self, fd, data):
        try:
            while data:
                data = data[os.write(fd, data):]
        except BlockingIOError:
            self.watch(fd, ("stdin", data), select.EPOLLOUT)
            return
        except BrokenPipeError:
            pass
        os.close(fd)

    def on_pipe(self, which, call, fd, final=False):
        full = which != "res" and len(call.out if which == "out" else call.err) >= MAX_OUT
        try:
            if full and SPLICE:
                # past what is kept only the count matters: the kernel drops the bytes, never copied into
                # the broker's one thread (an output flood cost it ~10 ms per call in reads)
                b = b""
                n = SPLICE(fd, self.null, 1 << 20, flags=os.SPLICE_F_NONBLOCK)
            else:
                b = os.read(fd, 1 << 16)
                n = len(b)
        except BlockingIOError:
            return "again"
        if n:
            if which == "res":
                if len(call.res) <= MAX_FETCH * 2:  # base64 + JSON of at most MAX_FETCH bytes
                    call.res += b
                return "data"
            if which == "out":
                if not full:
                    call.out += b[:MAX_OUT - len(call.out)]
                call.nout += n
                total = call.nout
            else:
                if not full:
                    call.err += b[:MAX_OUT - len(call.err)]
                call.nerr += n
                total = call.nerr
            if total > KILL_OUT and not call.killed and call.result is None:
                self.kill(call, REASON_OUTPUT)
            elif full and not final:
                self.pause(fd, which, call)
            return "data"
        self.unwatch(fd)
        os.close(fd)
        call.open -= 1
        if not final:
            self.maybe_finish(call)
        return "eof"

    def pause(self, fd, which, call):
        """Output nobody keeps is read once per OUT_PAUSE_S, through a pipe enlarged to 1 MiB: a flood's writer
        sleeps on the full pipe instead of taking a CPU, and wakes the broker 100 times a second at most."""
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)  # a no-op once it is that size
        except OSError:
            pass  # over the user's pipe quota: the default size, the same pause
        self.unwatch(fd)
        self.paused[fd] = (which, call, time.monotonic() + OUT_PAUSE_S)

    def resume(self, now, call=None):
        """Puts back the paused streams due by `now` and all of `call`'s; returns when the next one is due."""
        nearest = INF
        for fd, (which, c, due) in list(self.paused.items()):
            if due <= now or c is call:
                del self.paused[fd]
                self.watch(fd, (which, c))
            else:
                nearest = min(nearest, due)
        return nearest

    def drain(self, call):
        """Read a finished call's pipes to EOF. Its writers are gone, so each holds at most a buffer
        of data; a writer that escaped (an fd smuggled elsewhere) must not wedge the broker."""
        grace_end = time.monotonic() + 0.05
        if self.paused:
            self.resume(0.0, call)
        for fd, (which, c) in list(self.watched.items()):
            if c is not call:
                continue
            while True:
                r = self.on_pipe(which, call, fd, final=True)
                if r == "eof":
                    break
                if r == "again":
                    left = grace_end - time.monotonic()
                    if left <= 0 or not wait_readable(fd, left):
                        self.unwatch(fd)
                        os.close(fd)
                        call.open -= 1
                        call.held = True
                        break

    def on_zygote(self):
        msg = self.z.recv(256)
        if not msg:
            log("zygote died")
            if UID_BASE and not zygote.PID_NS:  # its calls' processes outlive it where no pid namespace ends them
                zygote.kill_uids(UID_BASE, SLOTS)
            os._exit(4)  # Node restarts the whole sandbox and retries in-flight calls
        res = ZRES.unpack(msg)
        if res[3] == REASON_SPAWN:
            self.spawn_failed(res[0], res[1])
            return
        if res[0] == self.procs_kill:
            self.procs_kill = 0
        s = self.sess_by_rid.get(res[0])
        if s is not None:
            self.session_died(s, res)
            return
        call = self.calls.get(res[0])
        if call is None:
            return
        call.reaped = True
        if call.answered:  # from its EXIT report; now the slot is free
            self.timed.discard(call)
            del self.calls[call.rid]
            self.dirty.append(call.slot)
            return
        self.timed.discard(call)
        rid, code, sig, reason, cpu_us, rss, leftovers = res
        call.result = (rid, code, sig, reason, self.wall_us(call), cpu_us, rss, leftovers)
        self.drain(call)
        self.maybe_finish(call)

    @staticmethod
    def take_exit_report(call):
        """The child's pid from the head of a stateless call's result pipe (written before its request existed) and
        EXIT from its end, both removed from the fetched bytes; returns the report, None if absent."""
        r = call.res
        if call.sess is not None or not isinstance(r, bytearray):
            return None
        Broker.take_pid(call)
        if len(r) < EXIT.size:
            return None
        magic, code, cpu_us, rss = EXIT.unpack_from(r, len(r) - EXIT.size)
        if magic != EXIT_MAGIC:
            return None
        del r[-EXIT.size:]
        return code, cpu_us, rss

    @staticmethod
    def take_pid(call):
        """A stateless call's pid, once its result pipe has given it; 0 before."""
        r = call.res
        if not call.pid and isinstance(r, bytearray) and len(r) >= 4:
            call.pid = int.from_bytes(r[:4], "little")
            del r[:4]
        return call.pid

    def maybe_finish(self, call):
        if call.open or call.answered:
            return
        if call.report is None:
            call.report = self.take_exit_report(call)
        report = call.report
        if call.result is None:  # no word from the zygote yet; a child that ended normally wrote EXIT
            # and is exiting: a snippet can write EXIT too, and then live on (issue 42), so its word counts only
            # once its process is ending. It stays timed until reaped, as its forks are swept only then.
            if report is None or call.id is None:
                return
            if not exiting(call.pid):
                # between its last write and its exit: looked at again every EXIT_POLL_S, not left to the zygote's
                # reap, which a zygote busy elsewhere (forking, killing) delays for every call
                self.exit_wait.add(call)
                return
            code, cpu_us, rss = report
            call.result = (call.rid, code, 0, REASON_NONE, self.wall_us(call), cpu_us, rss, 0)
        res = call.result
        if CG and res[3] == REASON_NONE and call.id is not None and (call.cg_oom or CG.oom_since(call.slot, res[2] == 9)):
            # the kernel killed a process of the call for its memory limit: the call is oom, even if it went on (or
            # the memory check saw it first, and its kill came after the kernel's, too late to be the reason)
            res = res[:3] + (REASON_MEMORY,) + res[4:]
            call.cg_oom = True
        call.answered = True
        if self.spawn_since:
            self.spawn_since.pop(call.id, None)
        if call.sess is None and call.reaped:
            del self.calls[call.rid]
            self.dirty.append(call.slot)
        if call.id is None:  # a spare that died before its request came
            self.spares.remove(call)
            for fd in (call.res, call.stdin):
                if isinstance(fd, int) and fd >= 0:
                    os.close(fd)
            self.spare_deaths += 1
            log(f"spare child died unused (code {res[1]}, signal {res[2]}): {bytes(call.err[-300:])!r}")
            if self.spare_deaths >= 3:
                self.prefork = False
                log("pre-forking turned off after 3 spares died unused")
            return
        self.spare_deaths = 0
        _, code, sig, reason, wall_us, cpu_us, rss, leftovers = res
        hdr = {"c": code if code >= 0 else None, "g": sig or None, "r": reason, "w": wall_us, "u": cpu_us,
               "m": rss, "l": leftovers, "no": call.nout, "ne": call.nerr, "o": len(call.out),
               "e": len(call.err)}
        if call.held:
            hdr["h"] = 1
        if CG:
            hdr["ko"] = int(CG.host[call.slot])
        if call.cg_oom:
            hdr["mc"] = CG.mb[call.slot]
        elif call.used_kb:
            hdr["mk"], hdr["ms"], hdr["mq"] = call.used_kb, call.shm_kb, call.sock_kb
        if call.files:
            hdr["mf"] = call.files
        if call.disk_kb:
            hdr["md"] = call.disk_kb
        if call.lost:
            hdr["sl"] = call.lost
        res = b""
        if call.fetch and call.res is not None:
            res = bytes(call.res)
            hdr["f"] = len(res)
        self.send(call.id, hdr, bytes(call.out), bytes(call.err) + res)

    def spawn_failed(self, rid, err):
        """The zygote could not fork the process of call or session `rid` (EAGAIN: the host's or a container's
        process limit, such as cgroup pids.max, is full, perhaps by a fork bomb in another slot; ENOMEM). Nothing
        ran, so its slot is free again and its request goes back to the head of its queue, to be tried after
        SPAWN_RETRY_S; a request that has been failing for longer than its own time limit is answered instead.
        On EAGAIN the call holding the most processes is killed (kill_most_procs)."""
        now = time.monotonic()
        self.spawn_retry = now + SPAWN_RETRY_S
        why = f"no process could be started for the call ({errno.errorcode.get(err, err)}: {os.strerror(err)})"
        if now - self.spawn_logged > 10:
            self.spawn_logged = now
            log(f"{why}; calls wait and are retried")
        if err == errno.EAGAIN:
            self.kill_most_procs()
        s = self.sess_by_rid.pop(rid, None)
        if s is not None:
            del self.sessions[s.sid]
            if s.sock.fileno() in self.watched:
                self.unwatch(s.sock.fileno())
            s.sock.close()
            self.release(s.slot)
            call, queue = s.call, self.sess_waiting
            if call is None:
                return
        else:
            call, queue = self.calls.pop(rid, None), self.waiting
            if call is None:
                return
            self.release(call.slot)
        self.timed.discard(call)
        self.drain(call)  # the zygote closed the child's ends: its pipes are at EOF
        if call.id is None:  # a spare: not a death of its own, so pre-forking stays on
            self.spares.remove(call)
            os.close(call.res)
            os.close(call.stdin)
            return
        since = self.spawn_since.setdefault(call.id, call.t0)
        if now - since < call.req[1] / 1000:
            queue.insert(0, call.req)
            return
        del self.spawn_since[call.id]
        hdr = {"c": None, "g": None, "r": REASON_SPAWN, "w": int((now - since) * 1e6), "u": 0, "m": 0, "l": 0,
               "no": 0, "ne": 0, "o": 0, "e": 0, "x": why}
        if call.sess is not None:
            hdr["sl"] = why  # Node drops the session: the broker no longer has it
        self.send(call.id, hdr)

    def kill_most_procs(self):
        """A full process limit is a shortage like a full memory: the kernel's OOM killer picks the biggest
        user of memory, and this picks the running call whose slot holds the most processes (at least two: a
        call is never killed for the process it needs to run), one at a time. Needs per-slot uids."""
        if not UID_BASE or self.procs_kill:
            return
        procs = self.procs  # at most MEM_CHECK_S old: no scan of /proc per failed fork, which recur every 20 ms
        call = max(self.timed, key=lambda c: procs.get(c.slot, 0), default=None)
        if call is None or call.killed or procs.get(call.slot, 0) < 2:
            return
        self.procs_kill = call.rid
        log(f"killed the call in slot {call.slot} ({procs[call.slot]} processes): {PROCS_WHY}")
        self.kill(call, REASON_PROCS)

    def release(self, slot):
        (self.sess_free if slot >= SLOTS - SESSION_SLOTS else self.free).append(slot)

    def on_event(self, which, call, fd):
        if which == "node":
            self.on_node()
        elif which == "zygote":
            self.on_zygote()
        elif which == "sess":
            self.on_sess(call)
        elif which == "stdin":
            self.unwatch(fd)
            self.write_stdin(fd, call)
        elif which == "wiped":
            for slot in self.wiper.done():
                self.release(slot)
            self.dispatch()
            self.dispatch_sessions()
        else:
            self.on_pipe(which, call, fd)

    def loop(self):
        self.start()
        timeout = None
        while True:
            watched = self.watched
            for fd, data in [(fd, watched.get(fd)) for fd, _ in self.ep.poll(-1 if timeout is None else timeout)]:
                if data is None or watched.get(fd) is not data:
                    continue  # closed (and perhaps reused) by an earlier event of this round
                which, call = data
                try:
                    self.on_event(which, call, fd)
                except Exception:  # noqa: BLE001 - one call's trouble must not end every other call
                    log(f"error handling a {which} event: {traceback.format_exc()}")
            self.flush()
            # after the answers went out: neither the wipe nor a spare's fork is on their latency
            if self.dirty:
                for slot in self.dirty:
                    if is_clean(slot):
                        self.release(slot)
                    else:
                        self.wiper.put(slot)
                self.dirty.clear()
                self.dispatch()
                self.dispatch_sessions()
            if self.spawn_retry and time.monotonic() >= self.spawn_retry:
                self.spawn_retry = 0.0
                self.dispatch()
                self.dispatch_sessions()
            self.refill()
            # last: dispatch may have started clocks
            busy = self.timed or self.paused or self.spawn_retry or self.leftovers or self.between
            timeout = self.check_deadlines() if busy else None


if __name__ == "__main__":
    Broker().loop()
