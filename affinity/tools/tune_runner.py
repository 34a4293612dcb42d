"""Running ``affinity tune``'s command: as the user runs it today (the defaults), and
once per trial through ``affinity run`` with the candidate placement applied.

A trial is the command line ``python -m affinity run <words> -- [env VAR=VALUE ...]
CMD`` (the launcher's own words for the configuration,
:meth:`~affinity.tuning.config.Config.run_options`), run as a child process in its
own session and process group, with a parent-death signal: the launcher sets the
masks, memory policy and environment and starts the instances.  One instance
writes to our pipe (``affinity run`` execs it); several write to ``DIR/instance-I.log`` in the runner's own folder.

Instances are **copies** of the command unless the work splits between them
(``split=True``: a service under load, or a command that reads
``AFFINITY_INSTANCE``/``AFFINITY_NUM_INSTANCES`` to take its share).  For copies the
value is one copy's work (the mean of their metrics; with ``--time`` the wall time,
each copy doing the whole job); when the work splits it is the sum of their metrics
(or the wall time of them all).  ``--time`` is the command's own time, from the
moment it starts (a time stamp written by ``sh`` just before it execs the command,
in the defaults' run and in every trial alike) to its end: ``affinity run``'s own
start-up is not charged to a trial.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import TuneUsageError
from ..record import record
from ..tuning.config import Config
from .tune_metric import parse_metric, parse_metrics
from .tune_report import fmt

__all__ = ["CommandRunner", "Measurement", "ran_out_of_memory", "remove_stale_folders"]

_TAIL = 1500
_PREFIX = "affinity-tune-"
_PR_SET_PDEATHSIG = 1
#: ``sh -c`` script: write the start time (ns) to "$0.<instance>", then become the command
_STAMP = 'date +%s%N > "$0.${AFFINITY_INSTANCE:-0}" && exec "$@"'


@record
class Measurement:
    """One run of the command.

    Parameters
    ----------
    value : float or None
        The value of the run (see the module docstring: one copy's work, or the
        sum when the work splits; with ``--time`` the wall time); None when the run
        failed or the metric was not found.
    seconds : float
        Wall time of the run.
    status : int
        Exit status (the worst instance's; -N for a signal).
    output : str
        The end of the output (every instance's, labelled).
    error : str or None
        Why ``value`` is None.
    per_instance : tuple of float
        Each instance's metric (empty with ``--time``).
    pruned : str or None
        Why the run was stopped early (multi-fidelity); ``value`` is then None.
    out_of_memory : bool
        The run failed for memory (:func:`ran_out_of_memory`).
    """

    value: float | None
    seconds: float
    status: int
    output: str
    error: str | None = None
    per_instance: tuple[float, ...] = ()
    pruned: str | None = None
    out_of_memory: bool = False


#: what a run that failed for memory prints: Python, C++, PyTorch's CPU and CUDA allocators, the kernel
_MEMORY = re.compile(r"MemoryError|OutOfMemoryError|out of memory|cannot allocate memory|can't allocate memory"
                     r"|std::bad_alloc", re.IGNORECASE)


def ran_out_of_memory(status: int, output: str) -> bool:
    """Whether a run that exited with ``status`` (-N for signal N; a launcher of several
    instances gives 128 + N) failed for memory: killed by SIGKILL, as the kernel's (or a
    container's) out-of-memory killer does, or saying so in its output."""
    return status != 0 and (status in (-signal.SIGKILL, 128 + signal.SIGKILL) or bool(_MEMORY.search(output)))


class CommandRunner:
    """Runs one command with the defaults or with a configuration.

    Parameters
    ----------
    command : sequence of str
        The command and its arguments (``{name}`` is replaced by the value of a
        placeholder parameter).
    metric : regex or str, optional
        ``--metric``; default the rate units and JSON ``throughput`` of
        :func:`~affinity.tools.tune_metric.parse_metric`.
    use_time : bool
        ``--time``: the value is the wall time.
    timeout : float, optional
        Seconds a run may take before it is stopped (infeasible).
    python : str
        The interpreter that runs ``-m affinity run``.
    environ : mapping, optional
        The environment the command runs in; default ``os.environ``.
    split : bool
        The work splits between instances (their metrics add up); else they are
        copies (one copy's work is the value).
    """

    def __init__(self, command: Sequence[str], *, metric: Any = None, use_time: bool = False,
                 timeout: float | None = None, python: str = sys.executable,
                 environ: Mapping[str, str] | None = None, split: bool = False):
        if not command:
            raise TuneUsageError("no command to tune: give it after '--' (affinity tune [options] -- CMD ...)")
        self.command = list(command)
        self.metric = metric
        self.use_time = use_time
        self.timeout = timeout
        self.python = python
        self.environ = dict(os.environ if environ is None else environ)
        self.split = split
        self._child: subprocess.Popen[bytes] | None = None
        self._folder: str | None = None

    # ---------------------------------------------------------------- runs
    def defaults(self, plain: Mapping[str, Any] | None = None) -> Measurement:
        """Run the command as it is (no ``affinity run``), the way the user runs it today.

        Parameters
        ----------
        plain : mapping, optional
            Values for its ``{name}`` placeholders (the first choice of each); nothing
            is exported.
        """
        words = self._words()
        for name, value in (plain or {}).items():
            words = [w.replace("{" + name + "}", str(value)) for w in words]
        return self._run(words, instances=1, log_dir=None)

    def trial(self, config: Mapping[str, Any] | Config, report: Callable[[int, float], bool] | None = None,
              cutoff: float | None = None) -> Measurement:
        """Run the command with ``config`` applied by ``affinity run``.

        Parameters
        ----------
        config : mapping or Config
            The configuration.
        report : callable, optional
            Multi-fidelity: ``report(step, value)`` for each value of the metric the
            command prints as it goes (step 0, 1, ...; with several instances, each
            step once every instance printed it); True stops the run (pruned).
        cutoff : float, optional
            Multi-fidelity with ``--time``: a run whose command has been running this
            many seconds (from its start stamp: the launcher's start-up not counted)
            cannot win: stopped (pruned).
        """
        cfg = Config.of(config)
        k = int(cfg.instances)
        log_dir = tempfile.mkdtemp(prefix="trial-", dir=self.folder()) if k > 1 else None
        try:
            return self._run(self.trial_argv(cfg, log_dir), instances=k, log_dir=log_dir, report=report,
                             cutoff=cutoff)
        finally:
            if log_dir is not None:
                shutil.rmtree(log_dir, ignore_errors=True)

    def trial_argv(self, config: Mapping[str, Any] | Config, log_dir: str | None = None) -> list[str]:
        """The command line of a trial."""
        opts = Config.of(config).run_options(self._words(), log_dir=log_dir)
        return [self.python, "-m", "affinity", "run", *opts.to_words(self.environ)]

    def _words(self) -> list[str]:
        """The command, behind a time stamp of its start with ``--time``."""
        if not self.use_time:
            return list(self.command)
        return ["sh", "-c", _STAMP, os.path.join(self.folder(), "start"), *self.command]

    def _started(self, instances: int) -> int | None:
        """The earliest start stamp (ns) the command's instances wrote, removing them."""
        stamps = []
        for i in range(instances):
            path = os.path.join(self.folder(), f"start.{i}")
            try:
                with open(path) as fh:
                    stamps.append(int(fh.read().strip()))
                os.unlink(path)
            except (OSError, ValueError):
                continue
        return min(stamps) if stamps else None

    def folder(self) -> str:
        """The runner's own temporary folder (``affinity-tune-PID-*``), made on first use."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        return self._folder

    def close(self) -> None:
        """Stop a run in progress and remove the runner's folder."""
        self.interrupt()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _run(self, argv: list[str], *, instances: int, log_dir: str | None,
             report: Callable[[int, float], bool] | None = None, cutoff: float | None = None) -> Measurement:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.environ, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        except OSError as e:
            return Measurement(None, 0.0, 127, "", f"cannot start {argv[0]}: {e.strerror}")
        self._child = proc
        watch = _Watch(self, proc, log_dir, instances, report,
                       cutoff, os.path.join(self.folder(), "start.0") if self.use_time else None)
        try:
            out, timed_out = watch.wait()
        finally:
            self._child = None
        end_ns = time.time_ns()
        secs = time.perf_counter() - t0
        start_ns = self._started(instances) if self.use_time else None
        if start_ns is not None:
            secs = max((end_ns - start_ns) / 1e9, 1e-6)  # the command's own time
        text = out.decode(errors="replace")
        if watch.pruned is not None:
            return Measurement(None, secs, proc.returncode, _tail(text), watch.pruned, pruned=watch.pruned)
        if log_dir is None:
            return self._measure([text], "", proc.returncode, secs, timed_out)
        return self._measure(self._logs(log_dir, instances), text, proc.returncode, secs, timed_out)

    @staticmethod
    def _logs(log_dir: str, instances: int) -> list[str]:
        texts = []
        for i in range(instances):
            path = os.path.join(log_dir, f"instance-{i}.log")
            try:
                with open(path, errors="replace") as fh:
                    texts.append(fh.read())
            except OSError:
                texts.append("")
        extra = sorted(set(glob.glob(os.path.join(log_dir, "instance-*.log"))) -
                       {os.path.join(log_dir, f"instance-{i}.log") for i in range(instances)})
        for path in extra:  # never expected; keep its text for the error message
            with open(path, errors="replace") as fh:
                texts.append(fh.read())
        return texts

    def _measure(self, logs: list[str], launcher: str, status: int, secs: float,
                 timed_out: bool) -> Measurement:
        if len(logs) > 1:
            shown = _tail(launcher + "".join(f"\n--- instance {i} ---\n{t}" for i, t in enumerate(logs)))
        else:
            shown = _tail(launcher + "\n" + logs[0])
        if timed_out:
            return Measurement(None, secs, status, shown, f"stopped after {self.timeout:.0f} s (--timeout)")
        if status != 0:
            if ran_out_of_memory(status, shown):
                return Measurement(None, secs, status, shown, f"exit status {status}, out of memory",
                                   out_of_memory=True)
            return Measurement(None, secs, status, shown, f"exit status {status}")
        if self.use_time:
            return Measurement(secs, secs, status, shown)
        values = []
        for i, text in enumerate(logs):
            v = parse_metric(text, self.metric)
            if v is None:
                who = f"instance {i}'s output" if len(logs) > 1 else "the output"
                return Measurement(None, secs, status, shown, f"no metric in {who}")
            values.append(v)
        total = sum(values) if self.split else sum(values) / len(values)
        return Measurement(total, secs, status, shown, per_instance=tuple(values))

    def interrupt(self) -> None:
        """Stop a run in progress (for a signal handler)."""
        if self._child is not None:
            _stop(self._child)


class _Watch:
    """Waiting for one run: its output read as it comes, the metric's values reported as
    they appear (multi-fidelity), the timeout and the cutoff; Ctrl-C, SIGTERM/SIGHUP
    (raised here by the command) and timeouts stop the child and its instances first."""

    def __init__(self, runner: CommandRunner, proc: subprocess.Popen[bytes], log_dir: str | None, instances: int,
                 report: Callable[[int, float], bool] | None, cutoff: float | None, stamp: str | None):
        self.runner, self.proc, self.log_dir, self.instances = runner, proc, log_dir, instances
        self.report, self.cutoff, self.stamp = report, cutoff, stamp
        self.pruned: str | None = None
        self._steps = 0

    def wait(self) -> tuple[bytes, bool]:
        """(the child's output, whether it timed out)."""
        timeout = self.runner.timeout
        deadline = None if timeout is None else time.perf_counter() + timeout
        buf = bytearray()
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                while True:
                    if sel.select(timeout=0.2):
                        chunk = os.read(fd, 1 << 16)
                        if not chunk:
                            break
                        buf += chunk
                    now = time.perf_counter()
                    if deadline is not None and now > deadline:
                        _stop(self.proc)
                        return bytes(buf) + self.proc.stdout.read(), True
                    if self._prune(buf):
                        _stop(self.proc)
                        return bytes(buf) + self.proc.stdout.read(), False
            self.proc.wait()
            return bytes(buf), False
        except BaseException:
            _stop(self.proc)
            raise

    def _running_for(self) -> float:
        """Seconds since the command itself started (its start stamp; 0 before it)."""
        try:
            with open(self.stamp or "") as fh:
                return max(0.0, (time.time_ns() - int(fh.read().strip())) / 1e9)
        except (OSError, ValueError):
            return 0.0

    def _prune(self, buf: bytearray) -> bool:
        if self.cutoff is not None and self._running_for() > self.cutoff:
            self.pruned = "pruned: still running when the best so far had finished twice over"
            return True
        if self.report is None:
            return False
        texts = [buf.decode(errors="replace")] if self.log_dir is None else \
            CommandRunner._logs(self.log_dir, self.instances)
        series = [parse_metrics(t, self.runner.metric) for t in texts]
        ready = min(len(s) for s in series) if series else 0
        while self._steps < ready:
            values = [s[self._steps] for s in series]
            value = sum(values) if self.runner.split else sum(values) / len(values)
            if self.report(self._steps, value):
                self.pruned = f"pruned at step {self._steps + 1} ({fmt(value)}): worse than the median " \
                              f"of the completed trials there"
                return True
            self._steps += 1
        return False


def remove_stale_folders() -> list[str]:
    """Remove the ``affinity-tune-PID-*`` folders of this user whose tuner is gone (one
    killed with ``kill -9`` could not remove its own); returns what was removed."""
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*")):
        m = re.match(rf"{_PREFIX}(\d+)-", os.path.basename(path))
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if m is None or st.st_uid != os.geteuid() or not os.path.isdir(path) or os.path.islink(path):
            continue
        if not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the tuner dies, even by ``kill -9`` (the
    launcher forwards it to its instances)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the child's process group (the launcher forwards it to its instances),
    then SIGTERM and SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGINT, 5.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(text: str) -> str:
    text = re.sub(r"\n{3,}", "\n\n", text.strip())
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]
