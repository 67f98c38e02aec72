"""rstar2 sandbox: broker + zygote that run untrusted Python snippets, one fresh fork per call.

Started by src/sandbox/pool.ts, normally inside one bubblewrap sandbox per pool, as
    /usr/bin/python3 -I -S server.py CONFIG_JSON

Processes:
  broker  talks to Node over stdin/stdout, owns every request's bytes, creates each call's pipes.
  zygote  forked before any request exists; preloads modules, then only forks children. It never
          sees code or stdin, so a child (a copy of the zygote) cannot find other requests in memory.
  child   one per call: own pipes on fds 0-2, Landlock, rlimits, per-slot uid, clean fds, then exec.
          With prefork (default) each idle slot holds a spare child, confined and blocked reading its
          stdin; a request takes the oldest spare and only its limits and payload are left to send.

Broker -> zygote (SOCK_SEQPACKET, pipes passed as fds): R = fork a child (for a request, or a spare),
  S = fork a session, K = kill; the zygote answers each child's end with ZRES once it has killed what
  the child left behind. The zygote does nothing else: after every fork each page it writes is a
  copy-on-write fault, so wall clocks and the scratch wipe live in the broker.

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

Sessions: a session process is forked by the zygote like a child and confined the same way
(own slot: scratch dir, uid, Landlock domain; rlimits; clean fds), then loops: it receives each
call's pipes over its own SOCK_SEQPACKET socket, runs the code in its persistent __main__, and
answers "D". The broker enforces the wall clock; a cell that overruns (or floods output) gets the
whole session killed by the zygote, and the slot is swept and wiped as for a stateless call.
"""

import builtins
import errno
import gc
import json
import os
import resource
import select
import selectors
import signal
import socket
import stat
import struct
import sys
import time
import types
import ctypes

CFG = json.loads(sys.argv[1])
SLOTS = int(CFG["slots"])  # stateless slots first, then session slots
SESSION_SLOTS = int(CFG.get("sessionSlots", 0))
UID_BASE = int(CFG.get("uidBase", 0))
SCRATCH = CFG["scratch"]
MAX_OUT = int(CFG.get("maxOutputBytes", 1 << 20))
MAX_FETCH = int(CFG.get("maxFetchBytes", 16 << 20))
FLAG_FETCH = 1 << 31
FLAG_SESSION = 1 << 30
FLAG_CLOSE = 1 << 29
FLAGS = FLAG_FETCH | FLAG_SESSION | FLAG_CLOSE
KILL_OUT = int(CFG.get("killOutputBytes", 16 << 20))
NPROC = int(CFG.get("nproc", 32))
FSIZE = int(CFG.get("fileSizeMb", 16)) << 20
NOFILE = int(CFG.get("nofile", 256))
SHM = CFG.get("shmDir", "/dev/shm")
PREFORK = bool(CFG.get("prefork", True))
SETUP_FAILED = b"[rstar2-sandbox] setup failed: "

libc = ctypes.CDLL(None, use_errno=True)
# bound once with fixed argument types: each child calls them, and every Python-level step in a
# child costs copy-on-write page faults
_prctl = libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_ll_restrict = libc.syscall
PID_NS = bool(CFG.get("pidNamespace", False))
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
REASON_NONE, REASON_TIMEOUT, REASON_OUTPUT, REASON_CLOSED = 0, 1, 2, 3
INF = float("inf")
ZRES = struct.Struct("<IiiBIII")  # rid, exit code (-1), signal (0), reason, cpu us, rss kb, leftovers
ZRUN = struct.Struct("<IIH")  # rid, mem mb, slot
ZKILL = struct.Struct("<IB")  # rid, reason
SDONE = struct.Struct("<iII")  # session -> broker after a cell: exit code, cpu us, rss kb
LIM = struct.Struct("<II")  # broker -> child before the payload: timeout ms, mem mb (bit 31: fetch)
LIM_HDR = struct.Struct("<IIII")  # LIM followed by HDR, as a stateless child reads them
FD4 = struct.Struct("<iiii")  # up to 4 fds passed with a zygote message (missing ones read as -1)
FDS_SPACE = socket.CMSG_SPACE(FD4.size)
HDR = struct.Struct("<II")  # payload header: code length, files length


def log(msg):
    os.write(2, f"[rstar2-sandbox {os.getpid()}] {msg}\n".encode())


def slot_dir(slot):
    return f"{SCRATCH}/{slot}"


def slot_uid(slot):
    return UID_BASE + slot if UID_BASE else 0


# ------------------------------------------------------------------------------------- landlock --
# One ruleset per slot is built once in the zygote; a child only calls landlock_restrict_self.
# Syscall numbers 444-446 are the same on every architecture (unified syscall table).
LL_CREATE, LL_ADD, LL_RESTRICT = 444, 445, 446
LL_RULESETS = {}
LL_STATE = {"abi": 0, "reason": "disabled by config"}


def landlock_prepare():
    if not CFG.get("landlock", True):
        return
    abi = libc.syscall(LL_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        LL_STATE["reason"] = f"kernel has no Landlock (errno {ctypes.get_errno()})"
        return
    fs_all = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1
    net_all = 3 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP handled with no port allowed
    scoped = 3 if abi >= 6 else 0  # abstract unix sockets and signals stay inside the domain
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    attr = struct.pack("=QQQ", fs_all, net_all, scoped)
    read = 1 | 4 | 8  # EXECUTE | READ_FILE | READ_DIR
    dev = 2 | 4 | 8  # WRITE_FILE | READ_FILE | READ_DIR
    shm = dev | (1 << 5) | (1 << 8) | ((1 << 14) if abi >= 3 else 0)  # + REMOVE_FILE MAKE_REG TRUNCATE
    file_bits = 1 | 2 | 4 | ((1 << 14) if abi >= 3 else 0)

    def add(rs, path, access):
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                access &= file_bits
            rule = ctypes.create_string_buffer(struct.pack("=Qi", access & fs_all, pfd), 12)
            if libc.syscall(LL_ADD, rs, 1, rule, 0) != 0:
                log(f"landlock rule for {path} failed (errno {ctypes.get_errno()})")
        finally:
            os.close(pfd)

    for slot in range(SLOTS):
        rs = libc.syscall(LL_CREATE, ctypes.create_string_buffer(attr, 24), size, 0)
        if rs < 0:
            LL_STATE["reason"] = f"landlock_create_ruleset failed (errno {ctypes.get_errno()})"
            for fd in LL_RULESETS.values():
                os.close(fd)
            LL_RULESETS.clear()
            return
        for path in CFG.get("readPaths", []):
            add(rs, path, read)
        add(rs, "/dev", dev)
        add(rs, SHM, shm)
        add(rs, slot_dir(slot), fs_all)
        LL_RULESETS[slot] = rs
    LL_STATE.update(abi=abi, reason="")


# ---------------------------------------------------------------------------------------- child --
STDIO = None
MAIN = None  # the snippets' __main__, made in the zygote: every child starts with its own pristine copy


def read_exact(fd, n):
    first = os.read(fd, n) if n else b""
    if len(first) == n:  # the usual case, kept short: each Python step in a child costs page faults
        return first
    if not first:
        raise EOFError("request payload cut short")
    parts = [first]
    n -= len(first)
    while n > 0:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError("request payload cut short")
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


HOME_BYTES = {}


def set_home(slot):
    """HOME and TMPDIR point at the slot's scratch dir. Written below os.environ's mapping with bytes
    encoded in the zygote: os.environ.__setitem__ cost ~30 copy-on-write faults per call."""
    home = HOME_BYTES[slot]
    for key in (b"HOME", b"TMPDIR"):
        os.putenv(key, home)
        os.environ._data[key] = home


def child_main(slot, fds):
    """Runs in the forked child; never returns. It is set up before its request exists (a pre-forked spare
    waits, confined, in the first read); the request's own limits arrive with its payload."""
    try:
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[2], 2)
        # no_new_privs and empty supplementary groups are inherited from the zygote
        rs = LL_RULESETS.get(slot)
        if rs is not None and _ll_restrict(LL_RESTRICT, rs, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        if len(fds) > 3:  # after Landlock: fd 3 may have been a ruleset
            os.dup2(fds[3], 3)  # result pipe for fetched files
        os.closerange(len(fds) if len(fds) > 3 else 3, 1 << 20)  # broker socket, rulesets, other calls' pipes
        os.setsid()
        if not PID_NS:  # inside a PID namespace the whole tree dies with its init anyway
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        R = resource
        R.setrlimit(R.RLIMIT_NPROC, (NPROC, NPROC))
        R.setrlimit(R.RLIMIT_FSIZE, (FSIZE, FSIZE))
        R.setrlimit(R.RLIMIT_NOFILE, (NOFILE, NOFILE))
        R.setrlimit(R.RLIMIT_CORE, (0, 0))
        R.setrlimit(R.RLIMIT_MSGQUEUE, (0, 0))
        os.chdir(HOME_BYTES[slot])
        uid = slot_uid(slot)
        if uid:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # drops every capability
            _prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # keep /proc/self readable by the snippet
        timeout_ms, mem_mb, code_len, files_len = LIM_HDR.unpack(read_exact(0, 16))
        cpu = -(-timeout_ms // 1000) + 1
        R.setrlimit(R.RLIMIT_CPU, (cpu, cpu + 1))
        if mem_mb & ~FLAGS:
            R.setrlimit(R.RLIMIT_AS, ((mem_mb & ~FLAGS) << 20, (mem_mb & ~FLAGS) << 20))
        if len(fds) > 3 and not mem_mb & FLAG_FETCH:
            os.close(3)  # a spare always gets a result pipe; this call fetches nothing
        code = read_exact(0, code_len)
        fetch = ()
        if files_len:
            import base64

            spec = json.loads(read_exact(0, files_len))
            for name, b64 in spec.get("files", {}).items():
                with open(name, "wb") as f:  # names were validated by Node; Landlock confines writes
                    f.write(base64.b64decode(b64))
            fetch = spec.get("fetch", ())
        set_home(slot)
        for rng in RESEED:  # forked children would otherwise share the zygote's RNG state
            rng.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        gc.enable()
    except BaseException as e:  # noqa: BLE001 - any failure here is the sandbox's, not the snippet's
        try:
            os.write(2, SETUP_FAILED + repr(e).encode() + b"\n")
        finally:
            os._exit(121)
    rc = run_code(code, MAIN)
    try:  # the parts of interpreter shutdown a snippet can observe
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        if "atexit" in sys.modules:
            sys.modules["atexit"]._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:  # noqa: BLE001
            rc = rc or 120
    if fetch:
        send_fetched(fetch)
    os._exit(rc & 0xFF)


def run_code(code, mod):
    """exec() one snippet like `python -c`; returns the exit code (SystemExit handled)."""
    try:
        exec(compile(code, "<string>", "exec"), mod.__dict__)
    except SystemExit as e:
        c = e.code
        if c is None:
            return 0
        if isinstance(c, int):
            return c
        try:
            print(c, file=sys.stderr)
        except BaseException:  # noqa: BLE001
            pass
        return 1
    except BaseException as e:  # noqa: BLE001
        try:  # hide our own frames so the traceback reads like `python -c`
            e = e.with_traceback(e.__traceback__.tb_next)
            sys.excepthook(type(e), e, e.__traceback__)
        except BaseException:  # noqa: BLE001
            pass
        return 1
    return 0


def session_main(slot, mem_mb, fds):
    """A warm interpreter pinned to one session; runs in a forked child, never returns."""
    R = resource
    try:
        devnull = os.open("/dev/null", os.O_RDWR)
        for i in range(3):
            os.dup2(devnull, i)
        rs = LL_RULESETS.get(slot)
        if rs is not None and _ll_restrict(LL_RESTRICT, rs, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        os.dup2(fds[0], 3)  # control socket to the broker
        os.closerange(4, 1 << 20)
        os.setsid()
        if not PID_NS:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # RLIMIT_CPU: the soft limit is moved before each cell to (cpu used so far + that cell's budget)
        R.setrlimit(R.RLIMIT_CPU, (5, R.RLIM_INFINITY))
        if mem_mb:
            R.setrlimit(R.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
        R.setrlimit(R.RLIMIT_NPROC, (NPROC, NPROC))
        R.setrlimit(R.RLIMIT_FSIZE, (FSIZE, FSIZE))
        R.setrlimit(R.RLIMIT_NOFILE, (NOFILE, NOFILE))
        R.setrlimit(R.RLIMIT_CORE, (0, 0))
        R.setrlimit(R.RLIMIT_MSGQUEUE, (0, 0))
        home = slot_dir(slot)
        os.chdir(home)
        uid = slot_uid(slot)
        if uid:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        ctl = socket.socket(fileno=3)
        set_home(slot)
        for rng in RESEED:
            rng.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        gc.enable()
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(fds[0], b"E" + repr(e).encode()[:1000])
        finally:
            os._exit(121)
    while True:
        try:
            msg, cfds, _, _ = socket.recv_fds(ctl, 64, 4)
        except OSError:
            os._exit(0)
        if not msg or len(cfds) < 3:
            os._exit(0)
        (timeout_ms,) = struct.unpack_from("<I", msg)
        r0, c0 = R.getrusage(R.RUSAGE_SELF), R.getrusage(R.RUSAGE_CHILDREN)
        for i in range(3):
            os.dup2(cfds[i], i)
            os.close(cfds[i])
        res_fd = cfds[3] if len(cfds) > 3 else -1
        rc = 120
        try:
            used = r0.ru_utime + r0.ru_stime
            R.setrlimit(R.RLIMIT_CPU, (int(used) + -(-timeout_ms // 1000) + 1, R.RLIM_INFINITY))
            code_len, files_len = HDR.unpack(read_exact(0, 8))
            code = read_exact(0, code_len)
            fetch = ()
            if files_len:
                import base64

                spec = json.loads(read_exact(0, files_len))
                for name, b64 in spec.get("files", {}).items():
                    with open(name, "wb") as f:
                        f.write(base64.b64decode(b64))
                fetch = spec.get("fetch", ())
            # fresh stdio objects every cell: a cell that replaced sys.stdout does not break the next
            sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", closefd=False)
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__ = STDIO[1:]
            rc = run_code(code, MAIN)
            for f in (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
                try:
                    f.flush()
                except BaseException:  # noqa: BLE001
                    pass
            if fetch and res_fd >= 0:
                send_fetched(fetch, res_fd)
        except BaseException as e:  # noqa: BLE001 - payload or file errors: report, keep the session
            try:
                os.write(2, b"[rstar2-sandbox] session cell failed: " + repr(e).encode() + b"\n")
            except OSError:
                pass
        if res_fd >= 0:
            os.close(res_fd)
        devnull = os.open("/dev/null", os.O_RDWR)
        for i in range(3):
            os.dup2(devnull, i)  # our copies of the cell's pipes close: the broker sees EOF
        os.close(devnull)
        r1, c1 = R.getrusage(R.RUSAGE_SELF), R.getrusage(R.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
               + c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
        try:
            ctl.send(b"D" + SDONE.pack(rc & 0xFF, int(cpu * 1e6), r1.ru_maxrss))
        except OSError:
            os._exit(0)


def send_fetched(names, fd=3):
    import base64

    out, total = {}, 0
    for name in names:
        try:
            with open(name, "rb") as f:
                data = f.read(MAX_FETCH - total + 1)
        except OSError:
            continue  # a missing file is simply absent from the result
        if total + len(data) > MAX_FETCH:
            break
        total += len(data)
        out[name] = base64.b64encode(data).decode()
    try:
        view = memoryview(json.dumps(out).encode())
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass


# --------------------------------------------------------------------------------------- zygote --
def _libc_fork():
    pid = _fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork")
    return pid


_fork = libc.fork
fork = os.fork
RESEED = []  # random.Random instances the zygote holds; each child reseeds them, as random's hook would


def plain_fork_blocker(hooks, early):
    """Why children cannot use glibc's fork directly, or None when they can.

    CPython's after-fork work (re-creating the GIL and the import lock, running Python at-fork hooks) cost
    ~50 copy-on-write faults per child, and with threading imported (numpy imports it) ~150, 0.7 ms. In a
    zygote with a single thread that holds no lock, the hooks of threading, logging and lock re-inits
    have nothing to repair, and random's reseed is done by the child itself. Any other hook keeps os.fork."""
    if early:
        return f"{', '.join(early)} imported before the zygote could see the at-fork hooks"
    if len(os.listdir("/proc/self/task")) != 1:
        return "the zygote has more than one thread"
    for hook in hooks:
        after = hook.get("after_in_child")
        owner = getattr(after, "__self__", None)
        func = getattr(after, "__func__", after)
        where = (getattr(func, "__module__", None), getattr(func, "__qualname__", None))
        if after is None or where in (("threading", "_after_fork"), ("logging", "_after_at_fork_child_reinit_locks")):
            continue
        if getattr(after, "__name__", "") == "_at_fork_reinit":  # a lock's
            continue
        if where == ("random", "Random.seed") and owner is not None:
            RESEED.append(owner)
            continue
        return f"a preload registered an at-fork hook {where[0]}.{where[1]}"
    return None


def use_plain_fork(hooks, early):
    global fork
    if not CFG.get("plainFork", True):
        return  # os.fork, as asked
    why = plain_fork_blocker(hooks, early)
    if why:
        RESEED.clear()  # os.fork runs random's own hook
        log(f"children are forked with os.fork ({why}), which costs 0.1-0.7 ms more per call")
    else:
        fork = _libc_fork


def wipe(slot):
    """Empties a slot's scratch dir and its uid's files in /dev/shm. The broker does it once the zygote has
    reported the slot's processes dead, before the slot is given out again."""
    d = slot_dir(slot)
    uid = slot_uid(slot)
    try:
        with os.scandir(d) as it:
            entries = list(it)
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    import shutil

                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
            except OSError as ex:
                log(f"wipe of {e.path} failed: {ex}")
        os.chmod(d, 0o700)  # the owner (the slot uid) may have changed it; only root could chown
        if uid and SHM:
            with os.scandir(SHM) as it:
                for e in it:
                    try:
                        if e.stat(follow_symlinks=False).st_uid == uid:
                            os.unlink(e.path)
                    except OSError:
                        pass
    except OSError as ex:
        log(f"wipe of slot {slot} failed: {ex}")


class Zygote:
    def __init__(self, sock):
        self.sock = sock
        self.jobs = {}  # pid -> [rid, slot, reason, pidfd]
        self.by_rid = {}
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        tid = os.getpid()
        self.children_fd = os.open(f"/proc/{tid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        # A pidfd per child wakes the loop when it exits. No SIGCHLD handler and no wakeup fd: a child
        # would have to reset both, ~40 copy-on-write faults per call.
        self.ep = select.epoll()
        self.ep.register(sock.fileno(), select.EPOLLIN)

    def unknown_children(self):
        data = os.pread(self.children_fd, 1 << 16, 0)
        return [p for p in map(int, data.split()) if p not in self.jobs]

    @staticmethod
    def uid_of(pid):
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            return None
        return None

    def sweep(self, slot, pid):
        """Kill every process the call left behind; returns how many there were."""
        uid = slot_uid(slot)
        if not uid:  # no uid separation: best effort by session (a snippet can escape it with setsid)
            left = []
            for p in self.unknown_children():
                try:
                    if os.getsid(p) == pid:
                        os.kill(p, signal.SIGKILL)
                        left.append(p)
                except OSError:
                    pass
            for p in left:
                try:
                    os.waitpid(p, 0)
                except OSError:
                    pass
            return len(left)
        left = [p for p in self.unknown_children() if self.uid_of(p) in (uid, None)]
        if not left:
            return 0
        h = os.fork()  # kill(-1) as the slot uid reaches exactly that uid's processes, atomically
        if h == 0:
            try:
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(h, 0)
        # reap, including grandchildren that get re-parented to us while their parents die
        for _ in range(1000):
            rest = [p for p in self.unknown_children() if self.uid_of(p) in (uid, None)]
            if not rest:
                break
            for p in rest:
                try:
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
                except OSError:
                    pass
        return len(left)

    def start(self, rid, mem_mb, slot, fds, kind):
        pid = fork()
        if pid == 0:
            if kind == b"S":
                session_main(slot, mem_mb, fds)
            child_main(slot, fds)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.ep.register(pidfd, select.EPOLLIN)
        self.jobs[pid] = [rid, slot, REASON_NONE, pidfd]
        self.by_rid[rid] = pid

    def kill(self, rid, reason):
        pid = self.by_rid.get(rid)
        if pid is not None and self.jobs[pid][2] == REASON_NONE:
            self.jobs[pid][2] = reason
            os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid cannot have been reused

    def reap(self):
        while True:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is None:
                continue  # an orphan that exited by itself
            rid, slot, reason, pidfd = job
            del self.by_rid[rid]
            self.ep.unregister(pidfd)
            os.close(pidfd)
            leftovers = self.sweep(slot, pid)
            if os.WIFSIGNALED(status):
                code, sig = -1, os.WTERMSIG(status)
            else:
                code, sig = os.WEXITSTATUS(status), 0
            cpu = ru.ru_utime + ru.ru_stime
            self.sock.send(ZRES.pack(rid, code, sig, reason, int(cpu * 1e6), ru.ru_maxrss, leftovers))

    def loop(self):
        sock = self.sock.fileno()
        while True:
            exited = False
            for fd, _ in self.ep.poll():
                if fd != sock:
                    exited = True  # a child's pidfd
                    continue
                msg, anc, _, _ = self.sock.recvmsg(256, FDS_SPACE)
                fds = [fd for _, _, data in anc for fd in FD4.unpack_from(data.ljust(16, b"\xff"))
                       if fd >= 0] if anc else ()
                if not msg:  # broker gone: take every child with us
                    for pid in list(self.jobs):
                        os.kill(pid, signal.SIGKILL)
                    os._exit(0)
                kind = msg[0:1]
                if kind in (b"R", b"S"):
                    self.start(*ZRUN.unpack_from(msg, 1), fds, kind)
                elif kind == b"K":
                    self.kill(*ZKILL.unpack_from(msg, 1))
            if exited:
                self.reap()  # also orphans re-parented to us, which have no pidfd of ours


def preload():
    """Import configured modules and pay one-time lazy initialisations (compile() builds the AST
    types on first use, about 1.5 ms) once, so forked children inherit them copy-on-write."""
    global STDIO, MAIN
    # threading, random and logging must not be imported before the preloads: the at-fork hooks they
    # register are only recognised (and glibc's fork used, see plain_fork_blocker) when seen here.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # what a normal interpreter does
    os.environ.clear()
    os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8", OPENBLAS_NUM_THREADS="1",
                      OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HOME="/", TMPDIR="/")
    HOME_BYTES.update((slot, os.fsencode(slot_dir(slot))) for slot in range(SLOTS))
    # Fresh wrappers for fds 0-2, installed here and never written by the zygote, so a child finds them
    # in place after dup2(). Swapping them in each child cost ~60 copy-on-write faults (~0.2 ms): the
    # interpreter's original stream objects were torn down there, once per call.
    STDIO = (open(0, "r", encoding="utf-8", closefd=False),
             open(1, "w", encoding="utf-8", closefd=False),
             open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False))
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = STDIO
    sys.argv = ["-c"]
    failed = []
    early = sorted({"threading", "random", "logging"} & set(sys.modules))  # hooks registered before we looked
    hooks = []
    register_at_fork = os.register_at_fork
    os.register_at_fork = lambda **kw: (hooks.append(kw), register_at_fork(**kw))[1]
    try:
        for m in CFG.get("preload", []):
            try:
                __import__(m)
            except Exception as e:  # noqa: BLE001
                failed.append(f"{m}: {e!r}")
    finally:
        os.register_at_fork = register_at_fork
    use_plain_fork(hooks, early)
    with open(os.devnull, "w", encoding="utf-8") as f:
        exec(compile("import sys\nprint(sum(range(10)), file=f)", "<warmup>", "exec"), {"f": f})
        saved, sys.stderr = sys.stderr, f
        try:
            exec(compile("1 / 0", "<warmup>", "exec"), {})
        except ZeroDivisionError as e:
            sys.excepthook(type(e), e, e.__traceback__)
        finally:
            sys.stderr = saved
    MAIN = types.ModuleType("__main__")
    MAIN.__builtins__ = builtins
    sys.modules["__main__"] = MAIN
    landlock_prepare()
    gc.collect()
    gc.freeze()  # the collector would otherwise touch, and so copy, every inherited object
    gc.disable()  # children re-enable it; the zygote allocates almost nothing
    return failed


def zygote_main(sock):
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # never touch the Node protocol pipes
    os.close(devnull)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # children inherit it (bwrap sets it too)
    if UID_BASE:
        os.setgroups([])  # once here instead of in every child
    for s in range(SLOTS):
        d = slot_dir(s)
        os.makedirs(d, exist_ok=True)
        uid = slot_uid(s)
        if uid:
            os.chown(d, uid, uid)
        os.chmod(d, 0o700)
    failed = preload()
    z = Zygote(sock)
    sock.send(b"Y" + json.dumps({"landlock": LL_STATE["abi"], "landlockReason": LL_STATE["reason"],
                                 "preloadFailed": failed, "uidBase": UID_BASE}).encode())
    z.loop()


# --------------------------------------------------------------------------------------- broker --
class Call:
    __slots__ = ("id", "slot", "rid", "out", "err", "res", "nout", "nerr", "open", "result", "killed", "held",
                 "sess", "t0", "deadline", "lost", "stdin")

    def __init__(self, cid, slot, rid, sess=None):
        self.id, self.slot, self.rid = cid, slot, rid
        self.out, self.err = bytearray(), bytearray()
        self.res = None
        self.nout = self.nerr = 0
        self.open = 2
        self.result = None
        self.killed = self.held = False
        self.sess = sess
        self.t0 = 0.0
        self.deadline = INF
        self.lost = None
        self.stdin = -1


class Sess:
    __slots__ = ("sid", "slot", "rid", "sock", "call", "err", "closed")

    def __init__(self, sid, slot, rid, sock):
        self.sid, self.slot, self.rid, self.sock = sid, slot, rid, sock
        self.call = None
        self.err = ""
        self.closed = False


class Broker:
    def __init__(self):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.zpid = os.fork()  # before any request is read: the zygote never holds request data
        if self.zpid == 0:
            a.close()
            try:
                zygote_main(b)
            except BaseException as e:  # noqa: BLE001
                log(f"zygote failed: {e!r}")
            os._exit(3)
        b.close()
        self.z = a
        self.sel = selectors.DefaultSelector()
        self.inbuf = bytearray()
        self.waiting = []
        self.free = list(range(SLOTS - SESSION_SLOTS - 1, -1, -1))
        self.sess_free = list(range(SLOTS - 1, SLOTS - SESSION_SLOTS - 1, -1))
        self.sessions = {}  # sid -> Sess
        self.sess_by_rid = {}
        self.sess_waiting = []  # (cid, timeout_ms, flags, sid, payload) not started yet
        self.calls = {}  # rid -> Call (stateless)
        self.spares = []  # Calls of pre-forked children waiting, confined, for a request
        self.timed = set()  # Calls with a running wall clock
        self.dirty = []  # slots whose call has ended, to be wiped before they are given out again
        self.spare_deaths = 0
        self.prefork = PREFORK
        self.rid = 0
        self.outq = []

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
        info["ready"] = True
        self.send(0, info)
        self.flush()
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, ("node", None))
        self.sel.register(self.z, selectors.EVENT_READ, ("zygote", None))
        self.refill()  # spares for the first requests

    def on_node(self):
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:  # Node closed the pipe: shut down; the zygote kills its children
            os._exit(0)
        self.inbuf += chunk
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
        call.stdin, our result end call.res until arm_result decides."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child_fds = [in_r, out_w, err_w]
        if result_pipe:
            res_r, res_w = os.pipe()
            child_fds.append(res_w)
            call.res = res_r  # registered once the call is known to fetch files
            os.set_blocking(res_r, False)
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        self.sel.register(out_r, selectors.EVENT_READ, ("out", call))
        self.sel.register(err_r, selectors.EVENT_READ, ("err", call))
        os.set_blocking(in_w, False)
        call.stdin = in_w
        return child_fds

    def fork_child(self, call, result_pipe):
        child_fds = self.open_call(call, result_pipe)
        socket.send_fds(self.z, [b"R" + ZRUN.pack(call.rid, 0, call.slot)], child_fds)
        for fd in child_fds:
            os.close(fd)

    def arm_result(self, call, fetch):
        """Reads the result pipe only for a call that fetches files; otherwise our end closes at once."""
        if call.res is None:
            return
        if fetch:
            self.sel.register(call.res, selectors.EVENT_READ, ("res", call))
            call.res, call.open = bytearray(), 3
        else:
            os.close(call.res)
            call.res = None

    def begin(self, call, cid, timeout_ms, mem_mb, payload):
        """Hands a request to its (already forked) child: limits, then the payload, on its stdin."""
        call.id = cid
        self.start_clock(call, timeout_ms)
        self.arm_result(call, mem_mb & FLAG_FETCH)
        self.write_stdin(call.stdin, memoryview(LIM.pack(timeout_ms, mem_mb) + payload))

    def dispatch(self):
        while self.waiting and (self.spares or self.free):
            cid, timeout_ms, mem_mb, payload = self.waiting.pop(0)
            if self.spares:
                call = self.spares.pop(0)  # the oldest spare: the newest may still be setting up
            else:
                call = Call(None, self.free.pop(), self.next_rid())
                self.calls[call.rid] = call
                self.fork_child(call, bool(mem_mb & FLAG_FETCH))
            self.begin(call, cid, timeout_ms, mem_mb, payload)

    def refill(self):
        """Slots nobody waits for get a spare: fork and confinement then happen before the next request, not
        on its latency. A spare that dies unused three times in a row turns this off (a broken setup)."""
        while self.prefork and not self.waiting and self.free:
            call = Call(None, self.free.pop(), self.next_rid())
            self.calls[call.rid] = call
            self.spares.append(call)
            self.fork_child(call, True)

    # ------------------------------------------------------------------------------ sessions --
    def dispatch_sessions(self):
        keep = []
        for item in self.sess_waiting:
            cid, timeout_ms, mem_mb, sid, payload = item
            s = self.sessions.get(sid)
            if s is None:
                if not self.sess_free:  # a closed session's slot is still being swept
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
        self.sel.register(a, selectors.EVENT_READ, ("sess", s))
        return s

    def start_cell(self, s, cid, timeout_ms, mem_mb, payload):
        call = Call(cid, s.slot, s.rid, s)
        self.start_clock(call, timeout_ms)
        s.call = call
        child_fds = self.open_call(call, bool(mem_mb & FLAG_FETCH))
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
            self.sel.unregister(s.sock)
            return
        if msg[0:1] == b"E":
            s.err = msg[1:].decode("utf-8", "replace")
            return
        call = s.call
        if msg[0:1] != b"D" or call is None or call.killed:
            return
        rc, cpu_us, rss = SDONE.unpack_from(msg, 1)
        s.call = None
        self.timed.discard(call)
        call.result = (s.rid, rc, 0, REASON_NONE, self.wall_us(call), cpu_us, rss, 0)
        self.drain(call)
        self.maybe_finish(call)
        self.dispatch_sessions()

    def session_died(self, s, res):
        del self.sessions[s.sid]
        del self.sess_by_rid[s.rid]
        if s.sock.fileno() in self.sel.get_map():
            self.sel.unregister(s.sock)
        s.sock.close()
        wipe(s.slot)
        self.sess_free.append(s.slot)
        _, code, sig, reason, _, rss, leftovers = res
        if reason == REASON_TIMEOUT:
            why = "session killed: a call ran past its time limit"
        elif reason == REASON_OUTPUT:
            why = "session killed: a call passed the output limit"
        elif reason == REASON_CLOSED:
            why = "session closed"
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
        call.deadline = call.t0 + timeout_ms / 1000.0
        self.timed.add(call)

    @staticmethod
    def wall_us(call):
        return int((time.monotonic() - call.t0) * 1e6) if call.t0 else 0

    def check_deadlines(self):
        """Wall-clock limits, kept here rather than in the zygote, whose every step after a fork costs
        copy-on-write faults. A call past its deadline is killed with reason timeout (a session with its
        whole process). Returns seconds until the next deadline, or None."""
        nearest = INF
        now = time.monotonic()
        for call in list(self.timed):
            if call.killed:
                self.timed.discard(call)
            elif now >= call.deadline:
                call.killed = True
                self.timed.discard(call)
                self.z.send(b"K" + ZKILL.pack(call.rid, REASON_TIMEOUT))
            else:
                nearest = min(nearest, call.deadline)
        return None if nearest == INF else max(0.0, nearest - now)

    # ---------------------------------------------------------------------------------- pipes --
    def write_stdin(self, fd, data):
        try:
            while data:
                data = data[os.write(fd, data):]
        except BlockingIOError:
            self.sel.register(fd, selectors.EVENT_WRITE, ("stdin", data))
            return
        except BrokenPipeError:
            pass
        os.close(fd)

    def on_pipe(self, which, call, fd, final=False):
        try:
            b = os.read(fd, 1 << 16)
        except BlockingIOError:
            return "again"
        if b:
            if which == "res":
                if len(call.res) <= MAX_FETCH * 2:  # base64 + JSON of at most MAX_FETCH bytes
                    call.res += b
                return "data"
            if which == "out":
                if len(call.out) < MAX_OUT:
                    call.out += b[:MAX_OUT - len(call.out)]
                call.nout += len(b)
                total = call.nout
            else:
                if len(call.err) < MAX_OUT:
                    call.err += b[:MAX_OUT - len(call.err)]
                call.nerr += len(b)
                total = call.nerr
            if total > KILL_OUT and not call.killed and call.result is None:
                call.killed = True
                self.z.send(b"K" + ZKILL.pack(call.rid, REASON_OUTPUT))
            return "data"
        self.sel.unregister(fd)
        os.close(fd)
        call.open -= 1
        if not final:
            self.maybe_finish(call)
        return "eof"

    def drain(self, call):
        """Read a finished call's pipes to EOF. Its writers are gone, so each holds at most a buffer
        of data; a writer that escaped (an fd smuggled elsewhere) must not wedge the broker."""
        grace_end = time.monotonic() + 0.05
        for key in list(self.sel.get_map().values()):
            which, c = key.data
            if c is not call:
                continue
            while True:
                r = self.on_pipe(which, call, key.fd, final=True)
                if r == "eof":
                    break
                if r == "again":
                    left = grace_end - time.monotonic()
                    if left <= 0 or not select.select([key.fd], [], [], left)[0]:
                        self.sel.unregister(key.fd)
                        os.close(key.fd)
                        call.open -= 1
                        call.held = True
                        break

    def on_zygote(self):
        msg = self.z.recv(256)
        if not msg:
            log("zygote died")
            os._exit(4)  # Node restarts the whole sandbox and retries in-flight calls
        res = ZRES.unpack(msg)
        s = self.sess_by_rid.get(res[0])
        if s is not None:
            self.session_died(s, res)
            return
        call = self.calls.get(res[0])
        if call is None:
            return
        self.timed.discard(call)
        rid, code, sig, reason, cpu_us, rss, leftovers = res
        call.result = (rid, code, sig, reason, self.wall_us(call), cpu_us, rss, leftovers)
        self.drain(call)
        self.maybe_finish(call)

    def maybe_finish(self, call):
        res = call.result
        if res is None or call.open:
            return
        if call.sess is None:
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
        if call.lost:
            hdr["sl"] = call.lost
        res = b""
        if call.res is not None:
            res = bytes(call.res)
            hdr["f"] = len(res)
        self.send(call.id, hdr, bytes(call.out), bytes(call.err) + res)

    def loop(self):
        self.start()
        timeout = None
        while True:
            for key, _ in self.sel.select(timeout):
                cur = self.sel.get_map().get(key.fd)
                if cur is None or cur.data is not key.data:
                    continue  # closed (and perhaps reused) by an earlier event of this round
                which, call = key.data
                if which == "node":
                    self.on_node()
                elif which == "zygote":
                    self.on_zygote()
                elif which == "sess":
                    self.on_sess(call)
                elif which == "stdin":
                    self.sel.unregister(key.fd)
                    self.write_stdin(key.fd, call)
                else:
                    self.on_pipe(which, call, key.fd)
            self.flush()
            # after the answers went out: neither the wipe nor a spare's fork is on their latency
            if self.dirty:
                for slot in self.dirty:
                    wipe(slot)
                self.free.extend(self.dirty)
                self.dirty.clear()
                self.dispatch()
            self.refill()
            timeout = self.check_deadlines() if self.timed else None  # last: dispatch may have started clocks


if __name__ == "__main__":
    for p in CFG.get("sysPath", []):
        if os.path.isdir(p) and p not in sys.path:
            sys.path.append(p)
    Broker().loop()
