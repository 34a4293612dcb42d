"""The side-effect half of ``affinity run``: put a :class:`~affinity.launcher.build.Launch`
into effect.

:func:`execute` validates everything that can fail (the command exists, the mask
and memory policy can be set -- tried on this thread and read back) *before*
anything starts, then replaces this process with the command (``exec``, one
instance) or starts every instance, forwards signals to them and waits (several).
Each instance is started from this thread set to its mask and memory policy, so
the child inherits them; the thread is put back after each start.

This module loads the binding layer and the compiled core: ``affinity run``
imports it only when a command really runs (not for ``--dry-run``).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from ..binding import threads
from ..cpulist import format_list
from ..errors import BindError, CannotExecute, CommandError, MaskNarrowedError, PlanError
from ..machine import _native
from ..machine.topology import Topology
from ..machine.userfiles import why
from .build import Instance, Launch
from .numactl import show_text
from .options import say


__all__ = ["KILL_AFTER_S", "apply_instance", "execute", "kill_after", "show_current"]

#: seconds an instance has after a forwarded signal or the launcher's death before SIGKILL
#: (``AFFINITY_KILL_AFTER``; ``docker stop`` gives 10 too)
KILL_AFTER_S = 10.0
#: what the launcher forwards to the instances it started
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_State = tuple[frozenset[int], "tuple[str, frozenset[int]] | None"]


def _numa() -> Any:
    """:mod:`affinity.binding.numa`, for a memory policy the system refused (its test and message)."""
    from ..binding import numa  # lazy: only a refused memory policy needs it; a plain launch does not pay its import

    return numa


def _mempolicy_arg(policy: str, nodes: frozenset[int]) -> str:
    return policy if policy == "local" else f"{policy}:{format_list(nodes)}"


def apply_instance(inst: Instance, *, membind_optional: bool = False) -> list[str]:
    """Set the calling thread's memory policy and CPU mask to ``inst``'s, each read back.

    A child started (or exec'd) from this thread then has them.

    Parameters
    ----------
    inst : Instance
        Where to run and where memory goes.
    membind_optional : bool
        A memory policy the system refuses (``EPERM``, ``ENOSYS``) is a warning even
        when it was asked for explicitly.

    Returns
    -------
    list of str
        Warnings (a memory policy the container refused, when that is allowed).

    Raises
    ------
    BindError
        The memory policy was refused and required, or the mask could not be set.
    UnsupportedError
        The kernel reports another policy than the one set.
    """
    warnings = []
    if inst.mempolicy is not None:
        try:
            _native.set_mempolicy(inst.mempolicy, inst.mem_nodes)
        except BindError as e:
            if not _numa().is_refused(e):
                raise
            if membind_optional or not inst.mem_required:
                warnings.append(f"memory policy {_mempolicy_arg(inst.mempolicy, inst.mem_nodes)} not "
                                f"applied: {_numa().refused(e, 'running without it')}")
            else:
                raise _numa().refused(e, "start the container with --cap-add SYS_NICE, or pass "
                                      "--membind-optional to run without memory binding; nothing was "
                                      "started") from e
        else:
            try:
                pol, nodes = _native.get_mempolicy()
            except BindError as e:  # set but not readable (a seccomp filter): trust the kernel
                if not _numa().is_refused(e):
                    raise
                pol, nodes = inst.mempolicy, inst.mem_nodes
            want_nodes = inst.mem_nodes if inst.mempolicy != "local" else frozenset()
            if pol != inst.mempolicy or (want_nodes and nodes != want_nodes):
                raise MaskNarrowedError(
                    errno.EXDEV, "set_mempolicy", _mempolicy_arg(inst.mempolicy, inst.mem_nodes),
                    message=f"set_mempolicy({_mempolicy_arg(inst.mempolicy, inst.mem_nodes)}) read "
                            f"back as {pol}:{format_list(nodes)}")
    threads.set_affinity(inst.cpus, strict=True)
    return warnings


def _apply_and_warn(launch: Launch, inst: Instance, prefix: str = "") -> None:
    for w in apply_instance(inst, membind_optional=launch.membind_optional):
        say(f"warning: {prefix}{w}")


def show_current(launch: Launch, topology: Topology, mems_allowed: frozenset[int]) -> str:
    """Apply the launch's first instance to this thread and report, like ``numactl --show``,
    what the kernel then says this thread has.

    Parameters
    ----------
    launch : Launch
        Its first instance is applied (warnings go to stderr).
    topology : Topology
        This machine.
    mems_allowed : frozenset of int
        The nodes this process may allocate on.

    Returns
    -------
    str
        :func:`~affinity.launcher.numactl.show_text` of the mask and policy read back.

    Raises
    ------
    BindError, UnsupportedError
        As :func:`apply_instance`.
    """
    _apply_and_warn(launch, launch.instances[0])
    pol, nodes = _native.get_mempolicy()
    return show_text(topology, threads.get_affinity(), pol, nodes, mems_allowed)


def _save_state() -> _State:
    """This thread's mask and memory policy (``None`` where the container forbids
    reading it: then it cannot have been changed either)."""
    try:
        policy = _native.get_mempolicy()
    except BindError as e:
        if not _numa().is_refused(e):
            raise
        policy = None
    return threads.get_affinity(), policy


def _restore_state(state: _State) -> None:
    mask, policy = state
    threads.set_affinity(mask)
    if policy is None:
        return
    pol, nodes = policy
    try:
        _native.set_mempolicy(pol if pol in ("default", "local", "bind", "interleave", "preferred")
                              else "default", nodes)
    except BindError as e:
        if not _numa().is_refused(e):
            raise  # it could not be changed in the first place when refused


def _resolve_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    if not argv:
        raise PlanError("no command to run (put it after '--')")
    cmd = argv[0]
    if "/" in cmd:
        if not os.path.exists(cmd):
            raise CannotExecute(127, f"{cmd}: no such file")
        if os.path.isdir(cmd) or not os.access(cmd, os.X_OK):
            raise CannotExecute(126, f"{cmd}: not an executable file")
        return cmd
    found = shutil.which(cmd, path=env.get("PATH", os.defpath))
    if found is None:
        raise CannotExecute(127, f"{cmd}: command not found (PATH={env.get('PATH', os.defpath)})")
    return found


def execute(launch: Launch, environ: Mapping[str, str] | None = None) -> int:
    """Start ``launch``: exec its single instance, or start every instance and wait.

    Nothing is started unless every instance's command exists and its mask and
    memory policy could be applied.

    Parameters
    ----------
    launch : Launch
        What to start.
    environ : mapping of str to str, optional
        The environment the instances' variables are set on; default ``os.environ``.

    Returns
    -------
    int
        Several instances: the worst exit status (a signal ``N`` counts as ``128+N``).
        One instance is exec'd: no return on success.

    Raises
    ------
    CannotExecute
        A command is not found (127) or not executable (126).
    PlanError
        Nothing to run.
    BindError, UnsupportedError
        A mask or memory policy cannot be applied (see :func:`apply_instance`).
    """
    base_env = dict(os.environ if environ is None else environ)
    if not launch.instances:
        raise PlanError("nothing to run")
    envs = [{**base_env, **inst.env} for inst in launch.instances]
    exes = [_resolve_command(inst.argv, env) for inst, env in zip(launch.instances, envs)]
    for inst in launch.instances:
        if inst.log:
            _check_log(inst.log)
    if not launch.spawn:
        _exec(launch, envs[0], exes[0])  # no return
    return _spawn(launch, envs, exes)


def _check_log(path: str) -> None:
    """The log file can be written (its folder made), or a one-line CommandError
    before anything is applied or started (``--log-dir /proc/1``, ``/dev/null/x``)."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC, 0o644))
    except OSError as e:
        raise CommandError(f"--log-dir: cannot write {path}: {why(e)}") from None


def _exec(launch: Launch, env: dict[str, str], exe: str) -> NoReturn:
    """Apply the single instance to this process and replace it with the command."""
    inst = launch.instances[0]
    _apply_and_warn(launch, inst)
    if launch.verbose:
        import shlex  # lazy: only --verbose quotes the command

        say(f"pid {os.getpid()}: {inst.describe()}; exec {shlex.join(inst.argv)}")
    if inst.log:
        fd = os.open(inst.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(exe, list(inst.argv), env)
    except OSError as e:
        raise CannotExecute(126 if e.errno != errno.ENOENT else 127,
                           f"execve({exe}) failed: {e.strerror}") from e


def kill_after(environ: Mapping[str, str] | None = None) -> float:
    """Seconds an instance has to end after a signal the launcher forwarded, or after the
    launcher died, before it is killed (``SIGKILL``): ``AFFINITY_KILL_AFTER``, else
    :data:`KILL_AFTER_S`."""
    text = (os.environ if environ is None else environ).get("AFFINITY_KILL_AFTER", "")
    try:
        value = float(text)
    except ValueError:
        return KILL_AFTER_S
    return value if 0 <= value <= 86400 else KILL_AFTER_S


def _spawn(launch: Launch, envs: list[dict[str, str]], exes: list[str]) -> int:
    """Try every instance, start them all, forward signals, wait; the worst status."""
    saved = _save_state()
    _try_instances(launch, saved)
    grace = kill_after()
    watchdog = _Watchdog(grace)
    try:
        procs, handlers, received = _start_instances(launch, envs, exes, saved, watchdog.add)
        try:
            codes = _wait(launch, procs, received, grace)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
    finally:
        watchdog.done()
    statuses = [128 - c if c < 0 else c for c in codes]
    if launch.verbose:
        for inst, p, st in zip(launch.instances, procs, statuses):
            say(f"instance {inst.index} (pid {p.pid}) exited with status {st}")
    return max(statuses)


def _wait(launch: Launch, procs: list[_Started], received: list[int], grace: float) -> list[int]:
    """Every instance's exit code; once a signal was forwarded, an instance still running
    ``grace`` seconds later is killed (``SIGKILL``: one that ignores ``SIGTERM`` kept the
    launcher waiting out its whole run, which then said 0), and said so."""
    deadline = None
    while True:
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return [int(p.returncode) for p in procs]  # type: ignore[arg-type]
        if received and deadline is None:
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() >= deadline:
            for p in alive:
                say(f"instance {procs.index(p)} (pid {p.pid}) still running {grace:g} s after "
                    f"{signal.Signals(received[0]).name}: killed (SIGKILL)")
                p.send_signal(signal.SIGKILL)
            for p in alive:
                p.wait()
            continue
        alive[0].wait_a_while(0.25)  # (a forwarded signal starts the count while we wait)


class _Started:
    """An instance started: its PID, its exit code once reaped (``-N``: killed by
    signal N, as :mod:`subprocess` says it), and a pidfd to wait on where the
    kernel has them (Linux 5.3; before, :meth:`wait_a_while` sleeps instead).  It is
    signalled by PID only while it is not reaped: a child's PID is not reused
    before its parent reaps it, so a signal never reaches another process."""

    def __init__(self, pid: int):
        self.pid = pid
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # ENOSYS: an older kernel
            self.pidfd = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._reaped(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._reaped(os.waitpid(self.pid, 0)[1])
        return int(self.returncode)  # type: ignore[arg-type]

    def wait_a_while(self, seconds: float) -> None:
        """Return when it exits or after ``seconds`` (a signal handler runs meanwhile)."""
        if self.pidfd is None:
            time.sleep(min(seconds, 0.05))
            return
        import select  # lazy: only several instances are waited for; one is exec'd

        select.select([self.pidfd], [], [], seconds)

    def send_signal(self, signum: int) -> None:
        """Signal it unless it has exited (then nothing)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def _reaped(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        if self.pidfd is not None:
            os.close(self.pidfd)


class _Watchdog:
    """A forked process that outlives a launcher killed outright (``SIGKILL``, the OOM
    killer): the kernel then sends each instance ``SIGTERM`` (its parent-death
    signal), and the watchdog kills (``SIGKILL``) those still running ``grace``
    seconds later -- an instance that ignores ``SIGTERM`` was left running, orphaned.
    It knows the instances by pidfd (a PID reused meanwhile is never signalled) and
    ends at once when the launcher says it is done.  What it cannot see: an instance
    whose start the launcher had not finished (the spawn returns once it has exec'd)
    when it was killed -- that one gets only the kernel's ``SIGTERM``."""

    def __init__(self, grace: float):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the watchdog
            try:
                os.close(w)
                _watch(r, grace)
            finally:
                os._exit(0)
        os.close(r)
        self.fd: int | None = w
        self.pid = pid

    def add(self, pid: int) -> None:
        if self.fd is not None:
            os.write(self.fd, b"%d\n" % pid)

    def done(self) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, b"done\n")
        finally:
            os.close(self.fd)
            self.fd = None
            os.waitpid(self.pid, 0)


def _watch(fd: int, grace: float) -> None:
    """The watchdog's work: the instances' PIDs come through ``fd`` until ``done``; an end
    of file without it is the launcher's death."""
    import select  # lazy: only the watchdog of several instances waits on pidfds

    for s in (*_FORWARDED, signal.SIGTSTP):  # the terminal's keys and a group's signals are the launcher's
        signal.signal(s, signal.SIG_IGN)
    pidfds: list[int] = []
    buf = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            if line == b"done":
                return
            try:
                pidfds.append(os.pidfd_open(int(line)))
            except OSError:  # gone already
                pass
    deadline = time.monotonic() + grace
    while pidfds and deadline > time.monotonic():
        ready, _, _ = select.select(pidfds, [], [], deadline - time.monotonic())
        pidfds = [f for f in pidfds if f not in ready]
    for f in pidfds:
        try:
            signal.pidfd_send_signal(f, signal.SIGKILL)
        except OSError:
            pass


def _try_instances(launch: Launch, saved: _State) -> None:
    """Apply every instance once (each warning said once), so that a refusal stops
    the launch before anything starts; this thread is put back after each."""
    said: set[str] = set()
    try:
        for inst in launch.instances:
            for w in apply_instance(inst, membind_optional=launch.membind_optional):
                if w not in said:
                    said.add(w)
                    say(f"warning: instance {inst.index}: {w}")
            _restore_state(saved)
    finally:
        _restore_state(saved)


def _start_instances(launch: Launch, envs: list[dict[str, str]], exes: list[str], saved: _State,
                     started: Callable[[int], None]) -> tuple[list[_Started], dict[int, Any], list[int]]:
    """Start every instance from this thread set to its mask and policy, forwarding
    the usual signals to them; on any failure the ones started are ended.

    The forwarding is in place before the first instance starts: a signal that
    arrives while they start reaches every instance started so far, and each later
    one as soon as it runs (an instance can run its command before the launcher has
    started the next one)."""
    procs: list[_Started] = []
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        for p in procs:
            p.send_signal(signum)

    handlers = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        for inst, env, exe in zip(launch.instances, envs, exes):
            apply_instance(inst, membind_optional=launch.membind_optional)  # warned when tried
            out = open(inst.log, "wb") if inst.log else None  # noqa: SIM115
            try:
                p = _Started(_native.spawn(exe, list(inst.argv), env, out_fd=out.fileno() if out else -1,
                                           deathsig=signal.SIGTERM))
                started(p.pid)  # the watchdog knows it before anything else is done
            finally:
                if out is not None:
                    out.close()
                _restore_state(saved)
            procs.append(p)
            for signum in list(received):  # arrived while it was starting
                p.send_signal(signum)
            if launch.verbose:
                say(f"pid {p.pid}: {inst.describe()}" + (f", log {inst.log}" if inst.log else ""))
    except BaseException:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        for p in procs:  # never leave a partial launch behind
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        raise
    return procs, handlers, received

