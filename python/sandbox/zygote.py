"""rstar2 sandbox: the zygote and the children it forks (one per call), plus stateful sessions.

This module does not run on its own. broker.py (the broker) compiles it, runs it with CFG (the pool's
config dict) put into its namespace first, and starts the zygote as a fresh interpreter that gets the
same compiled code and CFG over a pipe (see broker.py, start_zygote). A fresh interpreter, not a fork of
the broker: fork copies the page tables of every resident anonymous page and each child's exit unmaps
them again, ~0.05 ms per MiB per call on this machine, and the broker carries ~3 MiB the children never
use (its compile of two modules, selectors and its own state).

  zygote  preloads modules, then only forks children. It never sees code or stdin, so a child (a copy
          of the zygote) cannot find other requests in memory.
  child   one per call: own pipes on fds 0-2, Landlock, rlimits, per-slot uid, clean fds, then exec.
          With prefork (default) each idle slot holds a spare child, confined and blocked reading its
          stdin; a request takes the oldest spare and only its limits and payload are left to send.

Broker -> zygote (SOCK_SEQPACKET, pipes passed as fds): R = fork a child (for a request, or a spare),
  S = fork a session, K = kill, F = tell a call's process to flush its output (flush_output); the zygote
  answers each child's end with ZRES once it has killed what the child left behind. The zygote does
  nothing else: after every fork each page it writes is a copy-on-write fault, so wall clocks and the
  scratch wipe live in the broker.

Sessions: a session process is forked by the zygote like a child and confined the same way
(own slot: scratch dir, uid, Landlock domain; rlimits; clean fds), then loops: it receives each
call's pipes over its own SOCK_SEQPACKET socket, runs the code in its persistent __main__, and
answers "D". The broker enforces the wall clock; a cell that overruns (or floods output) gets the
whole session killed by the zygote, and the slot is swept and wiped as for a stateless call. Between cells the
broker keeps the session's process stopped (SIGSTOP), since the snippet can send "D" itself (Broker.check_between).
"""

import _socket
import builtins
import ctypes
import gc
import json
import os
import resource
import select
import signal
import stat
import struct
import sys
import types

CFG: dict  # set in this module's namespace by broker.py before the module runs
SLOTS = int(CFG["slots"])  # stateless slots first, then session slots
SESSION_SLOTS = int(CFG.get("sessionSlots", 0))
UID_BASE = int(CFG.get("uidBase", 0))
SCRATCH = CFG["scratch"]
MAX_FETCH = int(CFG.get("maxFetchBytes", 16 << 20))
FLAG_FETCH = 1 << 31
FLAG_SESSION = 1 << 30
FLAG_CLOSE = 1 << 29
FLAG_REPORT = 1 << 28  # set by the broker: the child writes EXIT (see report_exit)
FLAGS = FLAG_FETCH | FLAG_SESSION | FLAG_CLOSE | FLAG_REPORT
NPROC = int(CFG.get("nproc", 32))
FSIZE = int(CFG.get("fileSizeMb", 16)) << 20
NOFILE = int(CFG.get("nofile", 256))


def capped(res, n):
    """(n, n), or the hard limit inherited where it is lower: a child may lower a hard limit, never raise it."""
    hard = resource.getrlimit(res)[1]
    n = n if hard == resource.RLIM_INFINITY else min(n, hard)
    return n, n


NPROC_LIMIT, NOFILE_LIMIT = capped(resource.RLIMIT_NPROC, NPROC), capped(resource.RLIMIT_NOFILE, NOFILE)  # per child
# Limits the zygote sets on itself, so that its children inherit them instead of setting them once per call.
# NPROC and NOFILE stay per child: NPROC counts every process of the zygote's user, and the zygote holds an fd
# per live child.
ZYGOTE_LIMITS = ((resource.RLIMIT_FSIZE, capped(resource.RLIMIT_FSIZE, FSIZE)), (resource.RLIMIT_CORE, (0, 0)),
                 (resource.RLIMIT_MSGQUEUE, (0, 0)))
SHM = CFG.get("shmDir", "/dev/shm")
# per slot, the cgroup.procs fds of its memory and pids groups (broker.py's Cgroups): each call's process writes
# "0" to them first, so the kernel holds it and all it forks to the slot's limits; closed before any snippet runs
CG_ENTER = [tuple(fds) for fds in CFG.get("cgroupProcs") or ()]
SETUP_FAILED = b"[rstar2-sandbox] setup failed: "

libc = ctypes.CDLL(None, use_errno=True)
# bound once: each child calls them, and every Python-level step in a child costs copy-on-write page faults.
# Plain int arguments and no argtypes: converting through argtypes cost a child ~8 more faults.
_prctl = libc.prctl
_ll_restrict = libc.syscall
PID_NS = bool(CFG.get("pidNamespace", False))
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
REASON_NONE, REASON_TIMEOUT, REASON_OUTPUT, REASON_CLOSED, REASON_MEMORY = 0, 1, 2, 3, 4
# SPAWN: the zygote could not fork the call's process (ZRES's exit code is the errno); PROCS: the call was killed
# because its processes filled the host's process limit while another call could not start (see Broker.spawn_failed)
REASON_SPAWN, REASON_PROCS = 5, 6
REASON_BETWEEN = 7  # a session's process was found running between its cells (Broker.check_between)
ZRES = struct.Struct("<IiiBIII")  # rid, exit code (-1; errno for SPAWN), signal (0), reason, cpu us, rss kb, leftovers
ZRUN = struct.Struct("<IIH")  # rid, mem mb, slot
ZKILL = struct.Struct("<IB")  # rid, reason
KIND_R, KIND_S, KIND_K, KIND_F = b"RSKF"  # the first byte of a broker -> zygote message
SDONE = struct.Struct("<iII")  # session -> broker after a cell: exit code, cpu us, rss kb
LIM = struct.Struct("<II")  # broker -> child before the payload: timeout ms, mem mb (bit 31: fetch)
LIM_HDR = struct.Struct("<IIII")  # LIM followed by HDR, as a stateless child reads them
EXIT = struct.Struct("<IiII")  # stateless child -> broker, last on its result pipe: magic, exit code, cpu us, rss kb
EXIT_MAGIC = 0x54495845  # b"EXIT"
FDS_SPACE = _socket.CMSG_SPACE(16)  # up to 4 fds passed with a zygote message
FDN = {4 * n: struct.Struct(f"<{n}i") for n in range(5)}
HDR = struct.Struct("<II")  # payload header: code length, files length


def recv_fds(sock, size):
    """One message and the (up to 4) fds passed with it."""
    msg, anc, _, _ = sock.recvmsg(size, FDS_SPACE)
    if not anc:
        return msg, ()
    # no comprehension: the zygote runs this per call, and every object it touches is a copy-on-write fault
    fds = ()
    for _, _, data in anc:
        fds += FDN[len(data) & ~3].unpack_from(data)
    return msg, fds


def log(msg):
    os.write(2, f"[rstar2-sandbox {os.getpid()}] {msg}\n".encode())


def slot_dir(slot):
    return f"{SCRATCH}/{slot}"


def slot_uid(slot):
    return UID_BASE + slot if UID_BASE else 0


# A slot's dir belongs to root and the slot's group, so the snippet cannot chmod it open to the other slots' uids,
# where two concurrent calls met on a socket and passed fds (issue 42); without slot uids it is the only user's.
SLOT_MODE = 0o770 if UID_BASE else 0o700


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
        for path in CFG.get("devPaths", ["/dev"]):
            add(rs, path, dev)
        add(rs, SHM, shm)
        add(rs, slot_dir(slot), fs_all)
        LL_RULESETS[slot] = rs
    LL_STATE.update(abi=abi, reason="")


# ------------------------------------------------------------------------------------ no setsid --
# Each call runs in a session of its own, and with autogroups (CONFIG_SCHED_AUTOGROUP, on by default in Debian's
# and Ubuntu's kernels) the scheduler shares the CPU between sessions first, so a busy call takes one share
# however many processes it forks. A snippet whose forks each call setsid() took one share per fork: next to
# such a "session bomb" innocent calls answered in 10 ms at the median and 720 ms at p99 (4 slots, 2 cores).
# So after its own setsid a child stacks a filter that answers setsid with EPERM, inherited by its forks.
# Hand-assembled classic BPF: the arch check, then setsid (and its x32 number); anything else is allowed.
SETSID_NR = {"x86_64": (0xC000003E, 112), "aarch64": (0xC00000B7, 157)}.get(os.uname().machine)
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
NO_SETSID = None  # (struct sock_fprog, its instructions), built once in the zygote


def no_setsid_prepare():
    global NO_SETSID
    if SETSID_NR is None:
        log(f"no setsid filter for {os.uname().machine}: a snippet's forks may start sessions of their own")
        return
    arch, nr = SETSID_NR
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    # isolation landlock (no pid namespace): pidfd_open too, which tells a host pid from an unused one; the
    # sandbox's own filter cannot deny it, as the zygote itself needs it (seccomp_filter.py); 434 on every arch
    nrs = [nr, nr | 0x40000000] + ([434] if CFG.get("requireLandlock") else [])
    prog = [(ld, 0, 0, 4), (jeq, 0, 1 + len(nrs), arch), (ld, 0, 0, 0)]
    prog += [(jeq, len(nrs) - i, 0, n) for i, n in enumerate(nrs)]
    prog += [(ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050000 | 1)]  # ALLOW; ERRNO | EPERM
    fprog, insns = sock_fprog(b"".join(struct.pack("=HBBI", *i) for i in prog))
    pid = os.fork()  # tried once in a throwaway child: a kernel without seccomp filters must not fail every call
    if pid == 0:
        os._exit(0 if _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog, 0, 0) == 0 else 1)
    if os.waitpid(pid, 0)[1] != 0:
        log("the kernel refused the setsid filter: a snippet's forks may start sessions of their own")
        return
    NO_SETSID = (fprog, insns)  # a ctypes array is passed as its address


def sock_fprog(code):
    """(struct sock_fprog, its instructions) for classic BPF code (struct sock_filter[], 8 bytes each); the
    instructions must outlive every prctl that passes the program."""
    insns = ctypes.create_string_buffer(code, len(code))
    return ctypes.create_string_buffer(struct.pack("@HP", len(code) // 8, ctypes.addressof(insns))), insns


def install_filter(path):
    """Loads a compiled seccomp program (seccomp_filter.py's) on this process, for isolation landlock, where no
    bubblewrap loads it: the zygote's children and sessions inherit it."""
    with open(path, "rb") as f:
        fprog, insns = sock_fprog(f.read())
    if _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter")


def deny_setsid():
    if NO_SETSID and _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, NO_SETSID[0], 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter for setsid")


# ---------------------------------------------------------------------------------------- child --
# A call killed at its deadline would lose what the snippet printed into Python's buffers; code-judge's alarm
# handler flushes it before its kill, and the model saw that text. So a little before the deadline the broker has
# the zygote send FLUSH_SIGNAL to the call's process (Broker.check_deadlines); this handler, set once in the zygote
# and inherited, flushes the streams and line-buffers them, so what is printed until the kill arrives too. The
# kill at the deadline still ends the call, which stays a timeout. Sent from outside, not a timer the child arms
# (code-judge's alarm): a call that ends in time pays nothing, and a snippet's own alarm() cannot cancel it. SIGURG,
# not SIGALRM: it is ignored by default, so a snippet that resets it or execs another program is not ended by it,
# and a snippet's own SIGALRM handler does not run early. Nothing here uses SIGURG (out-of-band TCP data).
FLUSH_SIGNAL = signal.SIGURG


def flush_output(signum, frame):
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
            f.reconfigure(line_buffering=True)
        except BaseException:  # noqa: BLE001 - a snippet's own stream object, or ours interrupted mid-write
            pass


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
SLOT_ENV = {}  # slot -> (address of its C environment block, os.environ's mapping for it, the block)
ENVIRON = ctypes.c_void_p.in_dll(libc, "environ")


def slot_environments():
    """One environment per slot with HOME and TMPDIR at its scratch dir, built once. Before each fork the zygote
    points libc's `environ` and os.environ's mapping at the slot's (enter_slot): two putenv calls in every child
    cost ~10 copy-on-write faults (glibc's setenv searches and extends its tree of known strings under a lock).
    A snippet's own putenv copies the block first, as glibc does with any environment it did not make."""
    for slot, home in HOME_BYTES.items():
        data = {**os.environ._data, b"HOME": home, b"TMPDIR": home}
        block = (ctypes.c_char_p * (len(data) + 1))(*(k + b"=" + v for k, v in data.items()), None)
        SLOT_ENV[slot] = (ctypes.addressof(block), data, block)


def enter_slot(slot):
    """The zygote's working dir and environment become the slot's just before it forks the slot's child, which
    inherits them: done in the child, these steps cost ~23 copy-on-write faults (ctypes' and os.environ's objects)."""
    addr, data, _ = SLOT_ENV[slot]
    ENVIRON.value = addr
    os.environ._data = data
    os.chdir(HOME_BYTES[slot])


def child_main(slot, fds):
    """Runs in the forked child; never returns. It is set up before its request exists (a pre-forked spare
    waits, confined, in the first read); the request's own limits arrive with its payload."""
    try:
        if CG_ENTER:  # first, while root: the move needs write access to the groups, which no slot uid has
            for fd in CG_ENTER[slot]:
                os.write(fd, b"0")
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[2], 2)
        # inherited from the zygote: no_new_privs, empty supplementary groups, umask, the slot's working dir and
        # environment (enter_slot), three of the limits (ZYGOTE_LIMITS)
        rs = LL_RULESETS.get(slot)
        if rs is not None and _ll_restrict(LL_RESTRICT, rs, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        if len(fds) > 3:  # after Landlock: fd 3 may have been a ruleset
            os.dup2(fds[3], 3)  # result pipe for fetched files
            # its first bytes, written before any request exists: which process the broker waits for (Broker.exiting)
            try:
                os.write(3, os.getpid().to_bytes(4, "little"))
            except OSError:
                pass  # the broker closed it already: this call reports nothing there
        os.closerange(len(fds) if len(fds) > 3 else 3, 1 << 20)  # broker socket, rulesets, other calls' pipes
        os.setsid()
        deny_setsid()
        if not PID_NS:  # inside a PID namespace the whole tree dies with its init anyway
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        R = resource
        R.setrlimit(R.RLIMIT_NPROC, NPROC_LIMIT)  # the rest are the zygote's own, inherited (see ZYGOTE_LIMITS)
        R.setrlimit(R.RLIMIT_NOFILE, NOFILE_LIMIT)
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
        if len(fds) > 3 and not mem_mb & (FLAG_FETCH | FLAG_REPORT):
            os.close(3)  # a spare always gets a result pipe; this call does not use it
        code = read_exact(0, code_len)
        fetch = ()
        if files_len:
            import base64

            spec = json.loads(read_exact(0, files_len))
            for name, b64 in spec.get("files", {}).items():
                with open(name, "wb") as f:  # names were validated by Node; Landlock confines writes
                    f.write(base64.b64decode(b64))
            fetch = spec.get("fetch", ())
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
    if mem_mb & FLAG_REPORT:
        report_exit(rc & 0xFF)
    os._exit(rc & 0xFF)


def report_exit(rc):
    """Writes EXIT last on the result pipe and closes the pipes, so the broker can answer during this process's
    teardown instead of after it and the zygote's report (idle p50 1.23 vs 1.56 ms), which still frees the slot.
    It costs the child ~0.06 ms, so the broker asks for it only when no request waits. The snippet can write
    the same bytes, so the broker believes them only once it sees this process exiting (Broker.exiting): a
    forged EXIT followed by a sleep no longer ended the call (issue 42); a child killed or crashed writes none."""
    R = resource
    s, c = R.getrusage(R.RUSAGE_SELF), R.getrusage(R.RUSAGE_CHILDREN)  # what wait4 would report
    cpu_us = int((s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime) * 1e6)
    try:
        os.write(3, EXIT.pack(EXIT_MAGIC, rc, cpu_us, max(s.ru_maxrss, c.ru_maxrss)))
    except OSError:
        pass
    os.closerange(0, 4)  # a process's own exit closes its fds only after unmapping its memory


def run_code(code, mod):
    """exec() one snippet like `python -c`; returns the exit code (SystemExit handled)."""
    # Like `python -c`, the working directory (the slot's scratch) comes first on the import path, so a module
    # the snippet wrote imports. Only here, confined: the zygote, root and inside a slot's dir when it forks,
    # must never import what a snippet left there.
    if sys.path[0] != "":
        sys.path.insert(0, "")
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
        if CG_ENTER:
            for fd in CG_ENTER[slot]:
                os.write(fd, b"0")
        devnull = os.open("/dev/null", os.O_RDWR)
        for i in range(3):
            os.dup2(devnull, i)
        rs = LL_RULESETS.get(slot)
        if rs is not None and _ll_restrict(LL_RESTRICT, rs, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        os.dup2(fds[0], 3)  # control socket to the broker
        os.closerange(4, 1 << 20)
        os.setsid()
        deny_setsid()
        if not PID_NS:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # RLIMIT_CPU: the soft limit is moved before each cell to (cpu used so far + that cell's budget)
        R.setrlimit(R.RLIMIT_CPU, (5, R.RLIM_INFINITY))
        if mem_mb:
            R.setrlimit(R.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
        R.setrlimit(R.RLIMIT_NPROC, NPROC_LIMIT)
        R.setrlimit(R.RLIMIT_NOFILE, NOFILE_LIMIT)
        uid = slot_uid(slot)
        if uid:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        ctl = _socket.socket(fileno=3)
        ctl.send(b"P" + struct.pack("<I", os.getpid()))  # which process is the session's (Broker.kill_leftovers)
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
            msg, cfds = recv_fds(ctl, 64)
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
            if STDIO[1].line_buffering:  # set by flush_output in a cell that then ended in time
                STDIO[1].reconfigure(line_buffering=False)
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


def kill_uid(uid):
    """SIGKILL to every process of one slot uid: kill(-1) from a helper running as that uid reaches exactly them,
    atomically (none can fork past it)."""
    try:
        h = os.fork()
    except OSError:  # the host's process limit is full, likely by the snippet's own forks
        kill_uids(uid, 1)
        return
    if h == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(h, 0)


def kill_uids(first, n):
    """kill(-1) as each of uids first..first+n-1 without a process to do it: SIGKILL to each live process of those
    uids found in /proc, until a scan finds none alive. Nothing is reaped meanwhile, so no pid comes free for a
    survivor to fork into. Used where no fork can be had, and at the end, where no pid namespace ends the rest."""
    for _ in range(100):
        alive = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/status", "rb") as f:
                    status = f.read()
                if b"\nState:\tZ" in status or not 0 <= int(status.split(b"\nUid:")[1].split()[0]) - first < n:
                    continue
                os.kill(int(name), signal.SIGKILL)
                alive += 1
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
        if not alive:
            return


DRAIN_S = 0.01  # how often the zygote looks for a killed call's leftovers while they die (Zygote.drain)


class Zygote:
    def __init__(self, sock):
        self.sock = sock
        self.jobs = {}  # pid -> [rid, slot, reason, pidfd]
        self.by_rid = {}
        self.draining = {}  # slot -> (its call's report, how many it left): sent once those have all died (drain)
        self.child_uid = {}  # pid -> uid of the children that are not jobs, as drain last saw them
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

    def sweep(self, slot, pid, killed):
        """Kill every process the call left behind; returns how many there were. A killed call's were killed
        with it (kill). Without slot uids they are also reaped here; with them drain waits for them."""
        if os.pread(self.children_fd, 1 << 16, 0).count(b" ") == len(self.jobs):
            return 0  # every child is a job (each pid is followed by a space): the usual case, kept short
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
        left = sum(1 for p in self.unknown_children() if self.uid_of(p) in (uid, None))
        if left and not killed:
            kill_uid(uid)
        return left

    def drain(self):
        """Reports each killed call whose leftovers have all died and been reaped, its grandchildren included, which
        come to us as their parents die. Nothing waits on them here: a killed process needs CPU to exit, and the
        zygote waiting on a fork bomb's few hundred forks, one by one, at nice 19 on a loaded host, took seconds
        in which no call was forked or reaped, so innocent calls that had finished in 0.3 ms timed out and Node's
        watchdog restarted the sandbox."""
        kids = self.unknown_children()
        known = self.child_uid
        self.child_uid = {p: known[p] if known.get(p) is not None else self.uid_of(p) for p in kids}
        live = set(self.child_uid.values())
        for slot, (report, left) in list(self.draining.items()):
            uid = slot_uid(slot)
            if uid in live or None in live:
                for p, u in self.child_uid.items():
                    if u in (uid, None):
                        try:
                            os.kill(p, signal.SIGKILL)  # kill(-1) reached it already; again for any it missed
                        except OSError:
                            pass
                continue
            del self.draining[slot]
            self.sock.send(ZRES.pack(*report, left))

    def start(self, rid, mem_mb, slot, fds, kind):
        try:
            enter_slot(slot)
            pid = fork()
        except OSError as e:
            # EAGAIN: the host's or a container's process limit (cgroup pids.max) is full, perhaps by a fork bomb
            # in another slot; ENOMEM. The call's trouble, not the sandbox's: the broker retries or answers it.
            for fd in fds:
                os.close(fd)
            self.sock.send(ZRES.pack(rid, e.errno or 0, 0, REASON_SPAWN, 0, 0, 0))
            return
        if pid == 0:
            if kind == KIND_S:
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
            # and everything it forked, now rather than after it is reaped: a killed process still needs CPU to exit,
            # and beside a fork bomb's forks (demoted with it, forking on) that took 0.1-3.5 s on a host where a
            # process is dear, so Node's watchdog took the sandbox for wedged and restarted it
            uid = slot_uid(self.jobs[pid][1])
            if uid:
                kill_uid(uid)

    def flush(self, rid):
        pid = self.by_rid.get(rid)
        if pid is not None and self.jobs[pid][2] == REASON_NONE:
            os.kill(pid, FLUSH_SIGNAL)

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
            leftovers = self.sweep(slot, pid, reason != REASON_NONE)
            if os.WIFSIGNALED(status):
                code, sig = -1, os.WTERMSIG(status)
            else:
                code, sig = os.WEXITSTATUS(status), 0
            cpu = ru.ru_utime + ru.ru_stime
            report = (rid, code, sig, reason, int(cpu * 1e6), ru.ru_maxrss)
            if leftovers and slot_uid(slot):
                self.draining[slot] = (report, leftovers)
            else:
                self.sock.send(ZRES.pack(*report, leftovers))

    def loop(self):
        sock = self.sock.fileno()
        while True:
            exited = False
            # while leftovers die, a look every DRAIN_S: they are reaped as they go, and have no pidfd of ours
            for fd, _ in self.ep.poll(DRAIN_S if self.draining else -1):
                if fd != sock:
                    exited = True  # a child's pidfd
                    continue
                try:
                    msg, fds = recv_fds(self.sock, 256)
                except ConnectionResetError:  # the broker exited with our reports unread
                    msg = b""
                if not msg:  # broker gone: take every child with us, and what they forked
                    for pid in list(self.jobs):
                        os.kill(pid, signal.SIGKILL)
                    if UID_BASE and not PID_NS:
                        kill_uids(UID_BASE, SLOTS)
                    os._exit(0)
                kind = msg[0]
                if kind == KIND_R or kind == KIND_S:
                    rid, mem_mb, slot = ZRUN.unpack_from(msg, 1)
                    self.start(rid, mem_mb, slot, fds, kind)
                elif kind == KIND_K:
                    rid, reason = ZKILL.unpack_from(msg, 1)
                    self.kill(rid, reason)
                elif kind == KIND_F:
                    self.flush(ZKILL.unpack_from(msg, 1)[0])
            if exited or self.draining:
                self.reap()  # also orphans re-parented to us, which have no pidfd of ours
            if self.draining:
                self.drain()


# What model-written math snippets import most, imported once here: `from fractions import Fraction` cost a
# child 4.3 ms of CPU, `import itertools, math, functools, collections` 1.2 ms; preloaded 0.9 ms each, while
# `print(1+1)` stays at 0.8 ms (the zygote grows by ~1 MiB).
STDLIB_PRELOAD = ("math", "fractions", "itertools", "functools", "collections", "re")


def preload():
    """Import configured modules and pay one-time lazy initialisations (compile() builds the AST
    types on first use, about 1.5 ms) once, so forked children inherit them copy-on-write."""
    global STDIO, MAIN
    # threading, random and logging must not be imported before the preloads: the at-fork hooks they
    # register are only recognised (and glibc's fork used, see plain_fork_blocker) when seen here.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # what a normal interpreter does
    signal.signal(FLUSH_SIGNAL, flush_output)
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
        for m in STDLIB_PRELOAD + tuple(CFG.get("preload", [])):
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
    # What -I -S take away and code-judge's and SandboxFusion's plain `python file.py` have: exit(), quit() and
    # help, which models call. (The working directory on the import path is the child's: see run_code.)
    import _sitebuiltins
    for name in ("exit", "quit"):
        setattr(builtins, name, _sitebuiltins.Quitter(name, "Ctrl-D (i.e. EOF)"))
    builtins.help = _sitebuiltins._Helper()
    MAIN = types.ModuleType("__main__")
    MAIN.__builtins__ = builtins
    sys.modules["__main__"] = MAIN
    slot_environments()  # after the preloads: what they put in the environment is kept
    landlock_prepare()
    no_setsid_prepare()
    gc.collect()
    gc.freeze()  # the collector would otherwise touch, and so copy, every inherited object
    gc.disable()  # children re-enable it; the zygote allocates almost nothing
    return failed


def anon_kb():
    """Resident anonymous memory: fork copies its page tables into every child, whose exit unmaps them."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Anonymous:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def zygote_main(fd):
    """The zygote process's entry (broker.py's ZYGOTE_BOOT); fd is its socket to the broker."""
    try:
        sock = _socket.socket(fileno=fd)
        devnull = os.open("/dev/null", os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # never touch the Node protocol pipes
        os.close(devnull)
        if PID_NS:  # without one, the zygote outlives the broker long enough to end its calls' forks (loop)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # children inherit it (bwrap sets it too)
        if UID_BASE:
            os.setgroups([])  # once here instead of in every child
        for s in range(SLOTS):
            d = slot_dir(s)
            os.makedirs(d, exist_ok=True)
            uid = slot_uid(s)
            if uid:
                os.chown(d, 0, uid)
            os.chmod(d, SLOT_MODE)
        # -S leaves site-packages out; preloads may live there. Debian's site puts pip's /usr/local one first.
        local = f"/usr/local/lib/python{sys.version_info[0]}.{sys.version_info[1]}/dist-packages"
        for p in [local, *CFG.get("sysPath", [])]:
            if os.path.isdir(p) and p not in sys.path:
                sys.path.append(p)
        failed = preload()
        if CFG.get("requireLandlock") and not LL_RULESETS:
            raise RuntimeError(f"isolation landlock needs Landlock: {LL_STATE['reason']}")
        if CFG.get("seccompPath"):
            install_filter(CFG["seccompPath"])
        for limit, value in ZYGOTE_LIMITS:  # inherited by every child and session, like the umask
            resource.setrlimit(limit, value)
        os.umask(0o077)  # /dev/shm is shared by the slots: what a snippet makes there is its own
        # Untrusted code first when the host's or a container's memory runs out: the kernel's OOM killer takes the
        # process with the most memory, which was the program that started the sandbox (a trainer) rather than
        # three calls holding 250 MB each. Inherited; the zygote, smaller than any child that fills memory, goes
        # only when no child is bigger (then the sandbox restarts).
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError as e:
            log(f"oom_score_adj: {e}")
        z = Zygote(sock)
        sock.send(b"Y" + json.dumps({"landlock": LL_STATE["abi"], "landlockReason": LL_STATE["reason"],
                                     "preloadFailed": failed, "uidBase": UID_BASE, "anonKb": anon_kb()}).encode())
        z.loop()
    except BaseException as e:  # noqa: BLE001
        log(f"zygote failed: {e!r}")
    os._exit(3)
