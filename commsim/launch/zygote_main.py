"""The warm zygote's own process: import once, then fork one rank per request.

Started by the launcher (commsim/launch/zygote.py) as `python -c` with its end of a
SOCK_SEQPACKET socket pair. It imports what every rank of a hosted run imports anyway
(PRELOAD: torch, torch.distributed and commsim's hosting), then the program's own modules
the run opted in, and waits. Per request it forks; the child turns into the process a fresh
`python PROG` with the rank's environment would have been before the program's first line
(`become_rank`), then runs the program in `__main__` and ends through the interpreter's own
exit (atexit, non-daemon threads, buffered output). The zygote reaps every child and tells
the launcher each exit status.

It forks only while it is single-threaded (`/proc/self/task` has one entry: a thread pool,
OpenMP's included, is not inherited by fork and its locks may be held, POSIX fork(2)) and
no torch operation ran in it (an opted-in module that ran one while imported): otherwise
it answers every request with why, and the launcher starts fresh interpreters.
It dies with its launcher (PR_SET_PDEATHSIG, and the end of its socket), and is the child
subreaper of what it forks (PR_SET_CHILD_SUBREAPER, man 2 prctl), so a process a rank
daemonized stays below it, where the run's end finds it (procs/tree.py `below`).
"""

from __future__ import annotations

import atexit
import builtins
import gc
import ctypes
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import posix
import select
import signal
import socket
import sys
import threading
import weakref
from types import CodeType
from typing import Any, NoReturn

from commsim.hosting.install.patches import Patches
from commsim.procs import tree

# What every rank imports before or while its program starts: torch, and commsim's hosting
# with what a rank's bootstrap and first CUDA call load (a generated scenario's machine and
# faults, the process fabric, the communicator). numpy.random is reseeded in each child.
# torch.distributed.tensor (DTensor, with sympy and torch.fx): torch imports it at a hosted
# rank's first aten op on a CUDA tensor (the hosted NCCL barrier's torch.zeros), 0.6 s of
# CPU in every rank of a run that was paid once here. encodings.idna: the codec the rank's
# first socket call on a host name (gloo's store) imports.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.tensor", "numpy.random",
           "encodings.idna", "commsim.launch.bootstrap",
           "commsim.hosting.surfaces.table", "commsim.scenario.generate",
           "commsim.scenario.runner", "commsim.hosting.state.fabric",
           "commsim.hosting.state.process_wait", "commsim.sim.process_fabric",
           "commsim.communicator")
PR_SET_PDEATHSIG = 1            # linux/prctl.h
MAX_MESSAGE = 1 << 20           # a spawn request: argv, environment, cwd
_process = Patches()            # what a child changes for its life (never restored)
_real_exit = posix._exit        # before the bootstrap wraps it
PROGRAMS_KEPT = 8
# (absolute path, path as given) -> (source, code): programs compiled in the zygote
_programs: dict[tuple[str, str], tuple[bytes, CodeType]] = {}


def send(sock: socket.socket, msg: dict) -> None:
    sock.send(json.dumps(msg).encode())


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _die_with(launcher: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != launcher:          # it died before the prctl took effect
        os._exit(0)


def preload(opt_in: list[str], where: str) -> str:
    """Import PRELOAD and the opted-in modules (`where` first on sys.path: the program's
    directory); why the zygote must not fork ('' when it may)."""
    for name in PRELOAD:
        importlib.import_module(name)
    from commsim.hosting.install.registry import surfaces
    from commsim.hosting.surfaces.table import MODULES
    from commsim.versions import installed
    surfaces(MODULES)                     # what bootstrap's install_all imports
    installed()                           # the installed versions every rank's machine reads
    ran: list[str] = []
    if opt_in:
        from torch.overrides import TorchFunctionMode

        class _Watch(TorchFunctionMode):
            # torch.overrides.TorchFunctionMode (torch 2.x): every torch function called
            # while the mode is active, factory functions included, passes through here.
            def __torch_function__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                ran.append(getattr(func, "__name__", repr(func)))
                return func(*args, **(kwargs or {}))

        if where:
            sys.path.insert(0, where)
        try:
            with _Watch():
                for name in opt_in:
                    importlib.import_module(name)
        except Exception as e:
            return f"importing the opted-in modules failed: {type(e).__name__}: {e}"
        if ran:
            return f"a torch operation ({ran[0]}) ran while the opted-in modules were imported"
    n = threads()
    if n > 1:
        return f"the zygote runs {n} threads after its imports (fork copies only one)"
    return ""


def warm_run(env: dict[str, str], cwd: str) -> None:
    """Make, before the fork, what every rank of a run would otherwise make alone after it and
    alike: the machine of a scenario generated from its id (topology, placement, faults: a
    pure function of the id, which load_scenario caches), so that a run's ranks inherit one.
    Only a generated id: a scenario file may change between the runs the zygote serves. What
    fails here fails again in the rank, which reports it."""
    path = env.get("COMMSIM_HOSTING", "")
    if not path:
        return
    from commsim.launch.config import RunConfig, load_scenario
    from commsim.scenario.generate import _ID
    try:
        spec = RunConfig.load(path).scenario
        if spec and _ID.match(spec.strip()) and not os.path.exists(os.path.join(cwd, spec)):
            load_scenario(spec)
    except Exception:
        pass


def _compiled(path: str, where: str) -> tuple[tuple[str, str], bytes, CodeType]:
    key = (os.path.abspath(os.path.join(where, path)), path)
    with io.open_code(key[0]) as f:
        source = f.read()
    got = _programs.get(key)
    if got is not None and got[0] == source:
        return key, source, got[1]
    return key, source, compile(source, path, "exec", dont_inherit=True)


def program_code(path: str, where: str = "") -> CodeType:
    """`path`'s code as `python PATH` compiles it (relative to the directory `where`, the
    rank's cwd): with none of this module's __future__ flags (compile inherits its caller's
    unless dont_inherit, and this module's `annotations` turned every annotation of a forked
    rank's program into a string). A program the zygote compiled before (warm_program) is
    not compiled again when its bytes are the same."""
    return _compiled(path, where)[2]


def warm_program(argv: list[str], cwd: str) -> None:
    """Compile the program (`python PROG`, not `-m`) before the fork, once for all the ranks
    and runs that run its same bytes; what fails here fails again in the rank."""
    if not argv or argv[0] == "-m":
        return
    try:
        key, source, code = _compiled(argv[0], cwd)
    except Exception:
        return
    if key not in _programs and len(_programs) >= PROGRAMS_KEPT:
        _programs.pop(next(iter(_programs)))
    _programs[key] = (source, code)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"exited": [pid, os.waitstatus_to_exitcode(status)]})


def _end_children() -> None:
    from commsim.procs import tree
    tree.end_tree((), below=[os.getpid()])


def serve(sock: socket.socket, why: str) -> tuple[dict, list[int]]:
    """Answer requests until the launcher goes; returns only in a forked child: its request
    and its fds (stdout, stderr)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    send(sock, {"ready": os.getpid(), "why": why})
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
            _reap(sock)
        if sock not in ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
        req = json.loads(msg) if msg else {"op": "exit"}
        if req.get("op") == "exit":
            _end_children()
            os._exit(0)
        if not why:               # before the thread count: it counts what these left too
            warm_run(req.get("env", {}), req.get("cwd", ""))
            warm_program(req.get("argv", []), req.get("cwd", ""))
        n = threads()
        refuse = why or (f"the zygote runs {n} threads (fork copies only one)" if n > 1 else "")
        if refuse:
            for fd in fds:
                os.close(fd)
            send(sock, {"refused": refuse})
            continue
        sync_r, sync_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()                   # start_new_session, as the fresh rank's Popen
            os.write(sync_w, b"x")
            for fd in (sync_r, sync_w, wake_r, wake_w):
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.detach()                 # its fd goes with closerange, the object with it
            return req, list(fds)
        os.close(sync_w)
        os.read(sync_r, 1)                # its session exists before the launcher learns its pid
        os.close(sync_r)
        for fd in fds:
            os.close(fd)
        send(sock, {"spawned": pid})


def become_rank(req: dict, fds: list[int]) -> None:
    """Make this forked child what a fresh interpreter of the rank would be at the program's
    first line: signals, fds 0-2 only, environment, cwd, argv, sys.path, seeds, and the
    generated sitecustomize (the hosting bootstrap) imported from the rank's PYTHONPATH."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))     # subprocess's close_fds
    env = dict(req["env"])
    if tree.PARENT_ENV in env:
        # A forked rank's parent is this zygote, not the launcher: the bootstrap's
        # PR_SET_PDEATHSIG ties it to the zygote, which dies with the launcher.
        env[tree.PARENT_ENV] = str(os.getppid())
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    argv = req["argv"]
    # sys.path as the interpreter builds it: the script's directory (the cwd for -m), then
    # PYTHONPATH, then the zygote's own site part (what follows its PYTHONPATH entries).
    first = os.getcwd() if argv[0] == "-m" else os.path.dirname(os.path.abspath(argv[0]))
    pp = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first] + pp + req["site_path"]
    # The finders the zygote cached stay (freeing them all was 5 ms a rank, each a
    # copy-on-write fault); invalidate_caches makes them list their directories again, and a
    # path cached as having no finder (it did not exist then) is looked at afresh.
    for where in [k for k, v in sys.path_importer_cache.items() if v is None]:
        del sys.path_importer_cache[where]
    importlib.invalidate_caches()
    _process.attr(sys, "orig_argv", [sys.executable] + list(argv))
    import tempfile
    _process.attr(tempfile, "tempdir", None)   # computed from TMPDIR on first use
    # weakref.finalize callbacks registered in the zygote (torch.library's 134, which take
    # 0.14 s to deregister operators from the dispatcher of a process that is ending) are
    # the zygote's: at a rank's exit they would undo, or delete, what belongs to the zygote
    # and every later rank (a temporary directory made at import); none runs at its exit.
    for fin in list(weakref.finalize._registry):
        fin.atexit = False
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()              # numpy seeds its global state from the OS at import
    # (random reseeds itself in a forked child: random.py registers os.register_at_fork)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        site = importlib.util.module_from_spec(spec)
        _process.module("sitecustomize", site)
        spec.loader.exec_module(site)


def _user_traceback(tb: Any) -> Any:
    """The traceback from the program's first frame on, as a fresh interpreter prints it."""
    here = (__file__, "<string>")
    while tb is not None and (tb.tb_frame.f_code.co_filename in here
                              or tb.tb_frame.f_code.co_filename.endswith(("runpy.py",))):
        tb = tb.tb_next
    return tb


def _exit_status(code: Any) -> int:
    """SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def interpreter_exit(status: int, interrupted: bool = False) -> NoReturn:
    """End as the interpreter does, up to its module teardown (Py_FinalizeEx, CPython 3.11
    Python/pylifecycle.c: wait for the non-daemon threads, run the atexit callbacks, flush
    stdout and stderr), then _exit. The teardown that follows only frees the objects still
    alive; in a forked child it writes to every page of the zygote's heap it touches, each a
    copy-on-write fault (1.5 s a rank measured with torch loaded). Objects alive at exit are
    then not finalized, which Python does not promise either (reference, object.__del__)."""
    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            status = status or 120        # Py_FinalizeEx: a failed flush of stdout
    if interrupted:                       # an uncaught KeyboardInterrupt ends by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    _real_exit(status)


def run_program(argv: list[str]) -> NoReturn:
    """Run the program in `__main__` as `python PROG ARGS` / `python -m MOD ARGS` would,
    then end as its interpreter would."""
    import runpy
    try:
        if argv[0] == "-m":
            _process.attr(sys, "argv", [argv[1]] + list(argv[2:]))
            runpy._run_module_as_main(argv[1], alter_argv=True)   # what `python -m` calls
        else:
            _process.attr(sys, "argv", list(argv))
            path = argv[0]
            main = sys.modules["__main__"]
            d = main.__dict__
            d.clear()
            d.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None,
                     __file__=path, __cached__=None, __builtins__=builtins,
                     __loader__=importlib.machinery.SourceFileLoader("__main__", path))
            exec(program_code(path), d)
    except SystemExit as e:
        interpreter_exit(_exit_status(e.code))
    except BaseException as e:
        sys.excepthook(type(e), e, _user_traceback(e.__traceback__))
        interpreter_exit(1, isinstance(e, KeyboardInterrupt))
    interpreter_exit(0)


def main() -> None:
    fd, launcher = int(sys.argv[1]), int(sys.argv[2])
    opt_in = [m for m in sys.argv[3].split(",") if m]
    _die_with(launcher)
    sock = socket.socket(fileno=fd)
    site_path = [p for p in sys.path[1:]
                 if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    try:
        why = preload(opt_in, sys.argv[4])
    except Exception as e:
        why = f"the zygote's imports failed: {type(e).__name__}: {e}"
    from commsim.procs.tree import set_subreaper
    set_subreaper(True)
    # What the imports left goes to the permanent generation: a rank's collections then
    # never walk it, each walk a copy-on-write fault per page of the zygote's heap (gc.freeze,
    # Python 3.11 docs: "If a process will fork() without exec() ...").
    gc.collect()
    gc.freeze()
    req, fds = serve(sock, why)
    req["site_path"] = site_path
    become_rank(req, fds)
    run_program(req["argv"])
