"""A configuration of the tuner as a typed value: :class:`Config`.

The objective of :func:`affinity.tune` receives a plain ``dict`` (name -> value, the
names of its space); the tuner's own modules read it once, here, as a frozen
:class:`Config` whose fields are the names the tuner interprets (:data:`KNOWN
<affinity.tuning.space.KNOWN>`) and whose :attr:`~Config.env` and
:attr:`~Config.placeholders` hold the rest.

Three kinds of other names:

* ``env:NAME`` -- an environment variable ``NAME`` of the command (``affinity tune
  --param env:NAME=...``);
* a name written ``{name}`` in the command's words -- replaced there by the value;
* in :func:`affinity.tune`'s own space, any other name is the objective's business
  (it is neither exported nor substituted: the objective reads it from the dict).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..cpulist import IdList
from ..launcher.options import RunOptions
from ..record import record
from .priors import affinity_spec
from .space import ENV_PREFIX, KNOWN

__all__ = ["Config"]


@record
class Config:
    """One configuration, read once.

    Parameters
    ----------
    threads : int or None
        ``affinity run -t``: the team the plan places, per instance.
    omp, intra, inter : int or None
        ``OMP_NUM_THREADS``, ``TF_NUM_INTRAOP_THREADS``, ``TF_NUM_INTEROP_THREADS``.
    blocktime : int, str or None
        ``KMP_BLOCKTIME`` (ms or ``"infinite"``); None: not tuned.
    affinity, granularity : str or None
        The ``KMP_AFFINITY`` type (or a whole string) and its granularity.
    instances : int
        Processes started on disjoint shares.
    membind : {"none", "local", "interleave"}
        The memory policy.
    torch_threads, interop, dataloader_workers : int or None
        PyTorch's intra-op team (``OMP_NUM_THREADS``, which it reads), inter-op pool
        (``AFFINITY_TORCH_INTEROP_THREADS``, set by ``affinity run``'s PyTorch
        start-up hook) and DataLoader workers (``AFFINITY_DATALOADER_WORKERS``, for
        the program to pass as ``num_workers``).
    env : tuple of (str, str)
        Environment variables set in front of the command (``env:NAME`` parameters).
    placeholders : tuple of (str, object)
        Values of the other names (``{name}`` in the command's words).
    """

    threads: int | None = None
    omp: int | None = None
    intra: int | None = None
    inter: int | None = None
    blocktime: int | str | None = None
    affinity: str | None = None
    granularity: str | None = None
    instances: int = 1
    membind: str = "none"
    torch_threads: int | None = None
    interop: int | None = None
    dataloader_workers: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    placeholders: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, config: Mapping[str, Any] | Config) -> Config:
        """Read a configuration (a mapping of the space's names to values).

        Parameters
        ----------
        config : mapping or Config

        Returns
        -------
        Config
        """
        if isinstance(config, Config):
            return config
        known = {n: config[n] for n in KNOWN if config.get(n) is not None}
        env = tuple((n[len(ENV_PREFIX):], str(v)) for n, v in config.items() if n.startswith(ENV_PREFIX))
        other = tuple((n, v) for n, v in config.items() if n not in KNOWN and not n.startswith(ENV_PREFIX))
        return cls(**known, env=env, placeholders=other)

    @property
    def team(self) -> int | None:
        """The team the plan places: ``threads``, else ``omp``, else ``torch_threads``, else ``intra``."""
        for n in (self.threads, self.omp, self.torch_threads, self.intra):
            if n is not None:
                return int(n)
        return None

    @property
    def spec(self) -> str | None:
        """The ``KMP_AFFINITY`` string (None: the launcher's default spec)."""
        return affinity_spec({"affinity": self.affinity, "granularity": self.granularity})

    def run_options(self, command: Sequence[str] = (), *, log_dir: str | None = None) -> RunOptions:
        """The :class:`~affinity.launcher.options.RunOptions` of ``affinity run`` that
        apply this configuration to ``command`` (with :meth:`command_words`)."""
        kw: dict[str, Any] = {}
        if self.blocktime is not None:
            kw["blocktime"] = str(self.blocktime)
        if self.membind == "local":
            kw["mempolicy"] = "local"
        elif self.membind == "interleave":
            kw.update(mempolicy="interleave", mem_nodes=IdList.parse("all", "node"))
        return RunOptions(command=tuple(self.command_words(command)) if command else (), spec=self.spec,
                          threads=self.team, instances=int(self.instances), log_dir=log_dir, **kw)

    def env_overrides(self) -> dict[str, str]:
        """The variables set in front of the command: the counts the plan does not
        export itself, and the ``env:`` parameters."""
        env: dict[str, str] = {}
        if self.omp is not None and int(self.omp) != self.team:
            env["OMP_NUM_THREADS"] = str(self.omp)
        if self.intra is not None:
            env["TF_NUM_INTRAOP_THREADS"] = str(self.intra)
        if self.inter is not None:
            env["TF_NUM_INTEROP_THREADS"] = str(self.inter)
        if self.torch_threads is not None and int(self.torch_threads) != self.team:
            env["OMP_NUM_THREADS"] = str(self.torch_threads)
        if self.interop is not None:
            env["AFFINITY_TORCH_INTEROP_THREADS"] = str(self.interop)
        if self.dataloader_workers is not None:
            env["AFFINITY_DATALOADER_WORKERS"] = str(self.dataloader_workers)
        env.update(self.env)
        return env

    def command_words(self, command: Sequence[str]) -> list[str]:
        """``command`` with each ``{name}`` replaced, and ``env VAR=VALUE ...`` in front
        when :meth:`env_overrides` sets variables."""
        words = list(command)
        for name, value in self.placeholders:
            words = [w.replace("{" + name + "}", str(value)) for w in words]
        env = self.env_overrides()
        return (["env"] + [f"{k}={v}" for k, v in env.items()] + words) if env else words
