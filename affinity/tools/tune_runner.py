"""Running ``affinity tune``'s command: as the user runs it today (the defaults), and
once per trial through ``affinity run`` with the candidate placement applied.

A trial is the command line ``python -m affinity run <run_words> --log-dir DIR --
[env VAR=VALUE ...] CMD`` (:meth:`~affinity.tuning.config.Config.run_options`), run as a child process in
its own session: the launcher sets the masks, memory policy and environment and
starts the instances; each instance's output lands in ``DIR/instance-I.log``.
The metric is read from every instance's output and summed (throughput of the
copies together); with ``--time`` the value is the wall time per copy (the time of
the run divided by the instances: each copy does the whole work).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..tuning.config import Config
from ..errors import TuneUsageError
from .tune_metric import parse_metric

__all__ = ["CommandRunner", "Measurement"]

_TAIL = 1500


@dataclass(frozen=True)
class Measurement:
    """One run of the command.

    Parameters
    ----------
    value : float or None
        The metric (summed over instances), or the wall time per copy; None when the
        run failed or the metric was not found.
    seconds : float
        Wall time of the run.
    status : int
        Exit status (the worst instance's; -N for a signal).
    output : str
        The end of the output (every instance's, labelled).
    error : str or None
        Why ``value`` is None.
    """

    value: float | None
    seconds: float
    status: int
    output: str
    error: str | None = None


class CommandRunner:
    """Runs one command with the defaults or with a configuration.

    Parameters
    ----------
    command : sequence of str
        The command and its arguments (``{name}`` is replaced by the value of a
        parameter the tuner does not interpret).
    metric : regex or str, optional
        ``--metric``; default the rate units and JSON ``throughput`` of
        :func:`~affinity.tools.tune_metric.parse_metric`.
    use_time : bool
        ``--time``: the value is the wall time (per copy).
    timeout : float, optional
        Seconds a run may take before it is stopped (infeasible).
    python : str
        The interpreter that runs ``-m affinity run``.
    environ : mapping, optional
        The environment the command runs in; default ``os.environ``.
    """

    def __init__(self, command: Sequence[str], *, metric: Any = None, use_time: bool = False,
                 timeout: float | None = None, python: str = sys.executable,
                 environ: Mapping[str, str] | None = None):
        if not command:
            raise TuneUsageError("no command to tune: give it after '--' (affinity tune [options] -- CMD ...)")
        self.command = list(command)
        self.metric = metric
        self.use_time = use_time
        self.timeout = timeout
        self.python = python
        self.environ = dict(os.environ if environ is None else environ)
        self._child: subprocess.Popen[bytes] | None = None

    # ---------------------------------------------------------------- runs
    def defaults(self, plain: Mapping[str, Any] | None = None) -> Measurement:
        """Run the command as it is (no ``affinity run``), the way the user runs it today.

        Parameters
        ----------
        plain : mapping, optional
            Values for its ``{name}`` placeholders (the first choice of each parameter
            the tuner does not interpret); nothing is exported.
        """
        words = list(self.command)
        for name, value in (plain or {}).items():
            words = [w.replace("{" + name + "}", str(value)) for w in words]
        return self._run(words, instances=1, log_dir=None)

    def trial(self, config: Mapping[str, Any]) -> Measurement:
        """Run the command with ``config`` applied by ``affinity run``."""
        log_dir = tempfile.mkdtemp(prefix="affinity-tune-")
        try:
            argv = self.trial_argv(config, log_dir)
            return self._run(argv, instances=int(config.get("instances", 1)), log_dir=log_dir)
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)

    def trial_argv(self, config: Mapping[str, Any], log_dir: str) -> list[str]:
        """The command line of a trial."""
        opts = Config.of(config).run_options(self.command, log_dir=log_dir)
        return [self.python, "-m", "affinity", "run", *opts.to_words(self.environ)]

    def _run(self, argv: list[str], *, instances: int, log_dir: str | None) -> Measurement:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.environ, start_new_session=True)
        except OSError as e:
            return Measurement(None, 0.0, 127, "", f"cannot start {argv[0]}: {e.strerror}")
        self._child = proc
        try:
            out, timed_out = self._wait(proc)
        finally:
            self._child = None
        secs = time.perf_counter() - t0
        text = out.decode(errors="replace")
        if log_dir is None:
            return self._measure([text], "", proc.returncode, secs, instances, timed_out)
        return self._measure(self._logs(log_dir, instances), text, proc.returncode, secs, instances, timed_out)

    def _wait(self, proc: subprocess.Popen[bytes]) -> tuple[bytes, bool]:
        """Wait for the child; Ctrl-C and timeouts stop it (and its instances) first."""
        try:
            out, _ = proc.communicate(timeout=self.timeout)
            return out or b"", False
        except subprocess.TimeoutExpired:
            _stop(proc)
            out, _ = proc.communicate()
            return out or b"", True
        except KeyboardInterrupt:
            _stop(proc)
            raise

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

    def _measure(self, logs: list[str], launcher: str, status: int, secs: float, instances: int,
                 timed_out: bool) -> Measurement:
        if len(logs) > 1:
            shown = _tail(launcher + "".join(f"\n--- instance {i} ---\n{t}" for i, t in enumerate(logs)))
        else:
            shown = _tail(launcher + "\n" + logs[0])
        if timed_out:
            return Measurement(None, secs, status, shown, f"stopped after {self.timeout:.0f} s (--timeout)")
        if status != 0:
            return Measurement(None, secs, status, shown, f"exit status {status}")
        if self.use_time:
            return Measurement(secs / max(instances, 1), secs, status, shown)
        values = []
        for i, text in enumerate(logs):
            v = parse_metric(text, self.metric)
            if v is None:
                who = f"instance {i}'s output" if len(logs) > 1 else "the output"
                return Measurement(None, secs, status, shown, f"no metric in {who}")
            values.append(v)
        return Measurement(sum(values), secs, status, shown)

    def interrupt(self) -> None:
        """Stop a run in progress (for a signal handler)."""
        if self._child is not None:
            _stop(self._child)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the child's session (the launcher forwards it to its instances), then
    SIGTERM and SIGKILL if it lingers."""
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
