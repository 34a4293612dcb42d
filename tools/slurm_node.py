#!/usr/bin/env python3
"""A one-node Slurm on this machine, to try the Slurm recipes by hand and for the
engine tests: one implementation for both (standard library only; nothing of
``affinity`` is imported).

    python3 tools/slurm_node.py start [--dir DIR]     # or: make slurm
    source DIR/env.sh                                 # SLURM_CONF for srun, sbatch, sinfo
    python3 tools/slurm_node.py stop [--dir DIR]      # or: make slurm-stop
    python3 tools/slurm_node.py status [--dir DIR]

``DIR`` defaults to ``build/slurm`` in the checkout.  Needs root (``SlurmUser=root``)
and Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` (``make
sysdeps`` installs them); no service is installed or enabled, nothing outside
``DIR`` is written but the cgroups ``slurmd`` makes for its jobs.

:func:`start` writes ``slurm.conf`` and ``cgroup.conf`` into a fresh directory
(the node as ``slurmd -C`` finds this machine, ``SlurmUser=root``, ports that
were free, a munge key of its own), starts ``munged``, ``slurmctld`` and
``slurmd`` and waits until ``sinfo`` shows the node idle; :meth:`Slurm.stop`
cancels what is left and ends them.  The tests start the daemons as their own
children (``detach=False``: the kernel ends them if the test process dies);
``start`` on the command line detaches them, records their process ids in
``DIR/state.json``, and ``stop`` ends exactly those (each checked to be that
daemon of that directory before it is signalled).

What works in which container is decided by probing, once, and recorded on the
:class:`Slurm` value (``cgroup``, ``why``):

* ``task/cgroup`` and ``proctrack/cgroup`` need a cgroup v1 ``cpuset`` hierarchy
  this process may write (``slurmd`` makes ``slurm_<node>/uid_U/job_J/step_S``
  groups in it); Slurm 22.05's cgroup/v2 plugin needs systemd (it asks dbus for
  a scope), which containers do not run.  Without one: ``task/affinity`` alone
  and ``proctrack/linuxproc`` (process tracking by parent PID).
* ``task/affinity`` works everywhere ``sched_setaffinity`` does.

Besides the real node (partition ``test``, the default), :data:`EMULATED` more
``slurmd`` run on this machine under names of their own (``<host>-e1``...), each
with the same CPUs, ports and spool of its own (Debian's Slurm is built with
multiple-slurmd support): with the real node they make partition ``multi``, where a
step spans several "nodes" and srun writes the per-node variables as a cluster gets
them (``SLURM_STEP_TASKS_PER_NODE=2(x3),1``, ``SLURM_NODEID``).  They share the
real node's CPUs, so only the real node's partition says anything about placement.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "sinfo", "squeue", "scancel")
#: how long the daemons may take to come up, and a job to finish (generous: a loaded
#: machine only waits longer; no test asserts on time)
START_LIMIT = 60.0
_PR_SET_PDEATHSIG = 1
#: slurmd run under names of their own besides the real node's (partition ``multi``)
EMULATED = 3
#: GPUs of the real node (``gres/gpu``, device files linked to /dev/null: Slurm accepts those
#: as devices, and sets each task's GPU variables as on a GPU node)
GPUS = 2
#: the first line of every slurm.conf written here
MARK = "# written by tools/slurm_node.py"


def missing_tools() -> list[str]:
    return [t for t in DAEMONS + CLIENTS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def cgroup_v1_cpuset() -> tuple[bool, str]:
    """(usable, why): may slurmd make cpuset groups here (cgroup v1, writable)?"""
    top = Path("/sys/fs/cgroup/cpuset")
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError as e:
        return False, f"cannot read /proc/self/mounts: {e}"
    v1 = any(line.split()[1] == str(top) and line.split()[2] == "cgroup" for line in mounts)
    if not v1:
        return False, ("no cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset (Slurm 22.05's cgroup/v2 "
                       "plugin needs systemd, which this container does not run)")
    if os.geteuid() != 0 or not os.access(top, os.W_OK):
        return False, "the cgroup v1 cpuset hierarchy is not writable here"
    return True, "cgroup v1 cpuset hierarchy, writable"


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now (held open together so that they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_line() -> str:
    """``NodeName=... CPUs=... SocketsPerBoard=... CoresPerSocket=... ThreadsPerCore=...``
    as slurmd finds this machine (``slurmd -C``), memory left out (it moves)."""
    out = subprocess.run([_exe("slurmd"), "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    line = out.splitlines()[0]
    return " ".join(w for w in line.split() if not w.startswith("RealMemory="))


@dataclass
class Slurm:
    root: Path
    node: str  #: NodeName (this host's name)
    emulated: tuple[str, ...]  #: the other slurmd's node names (partition ``multi``)
    cpus: int  #: CPUs= of the node line
    cgroup: bool  #: task/cgroup and proctrack/cgroup in use
    why: str  #: why (not)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  #: daemons that are our children
    pids: dict[str, int] = field(default_factory=dict)  #: every daemon's process id (detached ones too)

    @property
    def env(self) -> dict[str, str]:
        """What a client (srun, sbatch, sinfo) needs on top of the caller's environment."""
        return {"SLURM_CONF": str(self.root / "slurm.conf")}

    def logs(self) -> str:
        parts = []
        for name in ("munged.log", "slurmctld.log", *(f"slurmd-{n}.log" for n in (self.node, *self.emulated)),
                     *(f"{d}.out" for d in self.procs)):
            p = self.root / name
            if p.exists():
                parts.append(f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)

    def client(self, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        base = dict(os.environ if env is None else env)
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              env={**base, **self.env})

    def node_states(self) -> dict[str, str]:
        r = self.client("sinfo", "-h", "-N", "-o", "%N %t", timeout=30)
        if r.returncode != 0:
            return {"(sinfo)": f"failed: {r.stderr.strip()}"}
        return dict(line.split() for line in r.stdout.splitlines() if line.strip())

    def wait_idle(self, limit: float = START_LIMIT) -> None:
        end = time.monotonic() + limit
        states: dict[str, str] = {}
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {p.returncode}\n{self.logs()}")
            states = self.node_states()
            if all(states.get(n) == "idle" for n in (self.node, *self.emulated)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the Slurm nodes are not idle after {limit:.0f} s (sinfo says {states})\n"
                           f"{self.logs()}")

    def alive(self) -> dict[str, int]:
        """The daemons of this directory still running (each checked to be that
        daemon, started on this directory's files: a process id the kernel gave to
        another process since is not ours)."""
        return {name: pid for name, pid in self.pids.items() if _is_ours(self.root, name, pid)}

    def stop(self) -> None:
        """Cancel what is left (a test that timed out leaves its job behind, and its
        slurmstepd would outlive slurmd), wait until the queue is empty, end the daemons."""
        running = self.alive()
        if "slurmctld" in running:
            self.client("scancel", "--full", "-u", "root", timeout=30)
            end = time.monotonic() + 30
            while time.monotonic() < end:
                q = self.client("squeue", "-h", "-o", "%i", timeout=30)
                if q.returncode != 0 or not q.stdout.strip():
                    break
                time.sleep(0.1)
        for name in reversed(list(self.pids)):
            if name not in running:
                continue
            p = self.procs.get(name)
            if p is not None:  # our child: wait() reaps it
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            else:
                _end(self.root, name, running[name])
        self.procs.clear()
        self.pids.clear()

    def to_dict(self) -> dict:
        return {"root": str(self.root), "node": self.node, "emulated": list(self.emulated), "cpus": self.cpus,
                "cgroup": self.cgroup, "why": self.why, "pids": self.pids}

    @staticmethod
    def from_dict(d: dict) -> Slurm:
        return Slurm(Path(d["root"]), d["node"], tuple(d["emulated"]), int(d["cpus"]), bool(d["cgroup"]),
                     d["why"], pids={k: int(v) for k, v in d["pids"].items()})


def _is_ours(root: Path, name: str, pid: int) -> bool:
    """Whether process ``pid`` runs daemon ``name`` (``munged``, ``slurmctld``,
    ``slurmd-<node>``) of the cluster in ``root``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                return False
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
    except OSError:
        return False
    if not argv or os.path.basename(argv[0]) != name.split("-", 1)[0]:
        return False
    if name == "munged":
        return f"--socket={root}/munge.socket" in argv
    return f"SLURM_CONF={root / 'slurm.conf'}".encode() in environ


def _end(root: Path, name: str, pid: int, limit: float = 20.0) -> None:
    """SIGTERM to daemon ``name`` (not our child), then wait until it is gone
    (SIGKILL after ``limit`` seconds)."""
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + limit
    while _is_ours(root, name, pid):
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            end += limit
        time.sleep(0.05)


def _slurm_conf(root: Path, node: str, line: str, ports: list[int], cgroup: bool,
                emulated: tuple[str, ...]) -> str:
    nodes = [f"{line} NodeAddr=127.0.0.1 Port={ports[1]} State=UNKNOWN Gres=gpu:{GPUS}"]
    nodes += [f"{line.replace(f'NodeName={node}', f'NodeName={e}', 1)} NodeAddr=127.0.0.1 Port={port} State=UNKNOWN"
              for e, port in zip(emulated, ports[2:])]
    return "\n".join([
        f"{MARK}: a one-node cluster (the engine tests', make slurm's)",
        "ClusterName=affinitytest",
        "GresTypes=gpu",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ports[0]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.socket",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool-%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        f"ProctrackType={'proctrack/cgroup' if cgroup else 'proctrack/linuxproc'}",
        f"TaskPlugin={'task/affinity,task/cgroup' if cgroup else 'task/affinity'}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=2",
        # job ids of their own (the control port's): two clusters on one machine (two test
        # runs) never share a step's cgroup, slurm_<node>/uid_0/job_<id>
        f"FirstJobId={ports[0] * 1000}",
        *nodes,
        f"PartitionName=test Nodes={node} Default=YES MaxTime=10 State=UP",
        f"PartitionName=multi Nodes={','.join((node, *emulated))} MaxTime=10 State=UP",
        "",
    ])


def _gres_conf(root: Path, node: str) -> str:
    """The real node's GPUs: device files of its own, each a link to /dev/null."""
    devices = root / "gpu-devices"
    devices.mkdir(exist_ok=True)
    for i in range(GPUS):
        link = devices / f"nvidia{i}"
        if not link.is_symlink():
            link.symlink_to("/dev/null")
    return f"NodeName={node} Name=gpu File={devices}/nvidia[0-{GPUS - 1}]\n"


def _cgroup_conf() -> str:
    # cores only: memory limits would move the job into this container's memory cgroup
    return "CgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainRAMSpace=no\n"


def _die_with_us() -> None:
    """``preexec_fn`` of a daemon: the kernel sends it SIGTERM when the test process dies,
    even by SIGKILL (a test run killed on a timeout never reaches the fixture's end)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _start_daemons(s: Slurm, detach: bool = False) -> None:
    """Start the daemons in sessions of their own: children of this process that the
    kernel ends with it, or (``detach``) daemons that outlive it."""
    r = s.root
    env = {**os.environ, **s.env}
    out = {}
    for name, argv in (
        ("munged", [_exe("munged"), "-F", "--force", f"--socket={r}/munge.socket",
                    f"--key-file={r}/munge.key", f"--pid-file={r}/munged.pid",
                    f"--log-file={r}/munged.log", f"--seed-file={r}/munge.seed"]),
        ("slurmctld", [_exe("slurmctld"), "-D", "-i"]),
        *((f"slurmd-{n}", [_exe("slurmd"), "-D", "-N", n]) for n in (s.node, *s.emulated)),
    ):
        out[name] = open(r / f"{name}.out", "wb")  # noqa: SIM115
        s.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out[name],
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=None if detach else _die_with_us)
        s.pids[name] = s.procs[name].pid
        out[name].close()
        if name == "munged":
            _wait_for_socket(s, r / "munge.socket")


def _wait_for_socket(s: Slurm, path: Path) -> None:
    end = time.monotonic() + START_LIMIT
    while not path.exists():
        if s.procs["munged"].poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"munged did not create {path}\n{s.logs()}")
        time.sleep(0.02)


def start(root: Path, attempts: int = 3, detach: bool = False) -> Slurm:
    """Configure and start a one-node Slurm in ``root``; raise RuntimeError with the
    daemons' logs when the node does not come up idle.  A port taken between the
    probe and slurmctld's bind is retried with new ports (``attempts`` times).
    ``detach``: the daemons outlive this process (:func:`main`'s ``start``)."""
    node = socket.gethostname().split(".")[0]
    line = node_line()
    cpus = int(next(w for w in line.split() if w.startswith("CPUs=")).split("=")[1])
    line = line.replace(line.split()[0], f"NodeName={node}", 1)
    cgroup, why = cgroup_v1_cpuset()
    error = ""
    for attempt in range(attempts):
        d = root / f"slurm-{attempt}"
        emulated = tuple(f"{node}-e{i}" for i in range(1, EMULATED + 1))
        for sub in ("state", *(f"spool-{n}" for n in (node, *emulated))):
            (d / sub).mkdir(parents=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ports = _free_ports(2 + EMULATED)
        (d / "slurm.conf").write_text(_slurm_conf(d, node, line, ports, cgroup, emulated))
        (d / "cgroup.conf").write_text(_cgroup_conf())
        (d / "gres.conf").write_text(_gres_conf(d, node))
        s = Slurm(d, node, emulated, cpus, cgroup, why)
        try:
            _start_daemons(s, detach)
            s.wait_idle()
            return s
        except RuntimeError as e:
            s.stop()
            error = str(e)
            if "Address already in use" not in error:
                break
    raise RuntimeError(f"could not start a one-node Slurm in {root}: {error}")


# ------------------------------------------------------------------ the command line
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "build" / "slurm"


def _state(d: Path) -> Slurm | None:
    try:
        return Slurm.from_dict(json.loads((d / "state.json").read_text()))
    except (OSError, ValueError, KeyError):
        return None


def cmd_start(d: Path) -> int:
    if os.geteuid() != 0:
        print("slurm_node: the one-node Slurm runs its daemons as root (SlurmUser=root): run it as root",
              file=sys.stderr)
        return 1
    missing = missing_tools()
    if missing:
        print(f"slurm_node: {', '.join(missing)} not installed (Debian: apt-get install slurmctld slurmd "
              f"slurm-client munge; make sysdeps does it)", file=sys.stderr)
        return 1
    old = _state(d)
    if old is not None and old.alive():
        print(f"slurm_node: already running in {d} (daemons {old.alive()}): stop it first", file=sys.stderr)
        return 1
    d.mkdir(parents=True, exist_ok=True)
    for sub in d.glob("slurm-[0-9]*"):  # an earlier run's files (ours: they carry the mark)
        conf = sub / "slurm.conf"
        if conf.exists() and conf.read_text().startswith(MARK):
            shutil.rmtree(sub)
    try:
        s = start(d, detach=True)
    except RuntimeError as e:
        print(f"slurm_node: {e}", file=sys.stderr)
        return 1
    (d / "state.json").write_text(json.dumps(s.to_dict(), indent=1) + "\n")
    (d / "env.sh").write_text(f"export SLURM_CONF={s.env['SLURM_CONF']}\n")
    print(f"Slurm is up: node {s.node} ({s.cpus} CPUs), partitions test (default) and multi "
          f"({len(s.emulated)} more nodes on the same CPUs); {s.why}.\n"
          f"  source {d / 'env.sh'}        # or: export SLURM_CONF={s.env['SLURM_CONF']}\n"
          f"  srun -n 1 hostname\n"
          f"stop it: make slurm-stop (python3 tools/slurm_node.py stop --dir {d})")
    return 0


def cmd_stop(d: Path) -> int:
    s = _state(d)
    if s is None:
        print(f"slurm_node: no Slurm was started in {d}", file=sys.stderr)
        return 1
    s.stop()
    (d / "state.json").unlink()
    print(f"Slurm in {d} stopped")
    return 0


def cmd_status(d: Path) -> int:
    s = _state(d)
    running = s.alive() if s is not None else {}
    if not running:
        print(f"no Slurm running in {d}")
        return 1
    print(f"Slurm running in {d}: {', '.join(f'{n} (pid {p})' for n, p in running.items())}; "
          f"SLURM_CONF={s.env['SLURM_CONF']}; nodes {s.node_states()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="slurm_node.py", description="Start, stop or look at the one-node Slurm "
                                 "of this checkout (the one the engine tests use).")
    ap.add_argument("command", choices=("start", "stop", "status"))
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"where its files go (default {DEFAULT_DIR})")
    a = ap.parse_args(argv)
    d = a.dir.resolve()
    return {"start": cmd_start, "stop": cmd_stop, "status": cmd_status}[a.command](d)


if __name__ == "__main__":
    sys.exit(main())
