"""Running a test's process the way containers run programs (shared by
tests/binding/test_unprivileged.py and tests/launcher/test_unprivileged_launch.py).

Two identities, made with util-linux's ``setpriv`` (the tests run as root, as CI does):

``root-without-CAP_SYS_NICE``
    Docker's default: root, but without the capability that lets a process
    change other users' processes (and that Docker's seccomp profile asks for
    before it lets the memory-policy calls through).
``nobody``
    A non-root user (uid/gid 65534) with no capabilities at all: Kubernetes'
    ``runAsNonRoot``.

And a seccomp filter, compiled here (``deny MODE CMD...``): ``docker`` refuses with
``EPERM`` every call Docker's default profile refuses without ``CAP_SYS_NICE``
(``get_mempolicy``, ``set_mempolicy``, ``mbind``, ``set_mempolicy_home_node``)
plus the two it refuses to everyone (``migrate_pages``, ``move_pages``);
``set`` refuses only ``set_mempolicy`` and ``mbind``.  Its library form
(``deny_mempolicy(mode)``) installs the same filter on the calling thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

NOBODY = 65534
CAP_SYS_NICE = 23

DENY_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "add this architecture"
#endif
#ifndef __NR_set_mempolicy_home_node
#define __NR_set_mempolicy_home_node 450
#endif

#define DENY(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), \
                 BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)
#define HEAD BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)), \
             BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0), \
             BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW), \
             BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define TAIL BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

/* mode "docker": Docker's default profile without CAP_SYS_NICE; "set": the two setters */
int deny_mempolicy(const char *mode)
{
    static struct sock_filter docker[] = {
        HEAD, DENY(__NR_get_mempolicy), DENY(__NR_set_mempolicy), DENY(__NR_mbind),
        DENY(__NR_set_mempolicy_home_node), DENY(__NR_migrate_pages), DENY(__NR_move_pages), TAIL};
    static struct sock_filter set[] = {HEAD, DENY(__NR_set_mempolicy), DENY(__NR_mbind), TAIL};
    struct sock_fprog prog;
    if (!strcmp(mode, "docker")) {
        prog.len = sizeof docker / sizeof docker[0];
        prog.filter = docker;
    } else if (!strcmp(mode, "set")) {
        prog.len = sizeof set / sizeof set[0];
        prog.filter = set;
    } else {
        errno = EINVAL;
        return -1;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        return -1;
    return 0;
}

#ifdef DENY_MAIN
int main(int argc, char **argv)
{
    if (argc < 3 || deny_mempolicy(argv[1])) {
        perror("deny_mempolicy");
        return 99;
    }
    execvp(argv[2], argv + 2);
    perror("execvp");
    return 98;
}
#endif
"""


@dataclass(frozen=True)
class Identity:
    """How to start a process as someone else: ``prefix + argv``."""

    name: str
    prefix: tuple[str, ...]
    uid: int

    def __str__(self) -> str:
        return self.name


def has_cap(cap: int) -> bool:
    with open("/proc/self/status") as fh:
        eff = next(int(line.split()[1], 16) for line in fh if line.startswith("CapEff:"))
    return bool(eff >> cap & 1)


def identity(name: str) -> tuple[Identity | None, str]:
    """The identity, or None and why it cannot be had here."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0:
        if name == "nobody" and not has_cap(CAP_SYS_NICE):
            return Identity("unprivileged (this user)", (), os.geteuid()), ""
        return None, "needs root to drop privileges with setpriv (CI runs the suite as root)"
    if setpriv is None:
        return None, "needs setpriv (util-linux)"
    if name == "root-without-CAP_SYS_NICE":
        return Identity(name, (setpriv, "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", "--"), 0), ""
    if name == "nobody":
        return Identity(name, (setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                               "--inh-caps=-all", "--bounding-set=-all", "--"), NOBODY), ""
    raise ValueError(name)


def python_runs_as(ident: Identity, cwd: Path) -> str:
    """'' when ``ident`` can run this interpreter with affinity's compiled core, else why not."""
    r = subprocess.run([*ident.prefix, sys.executable, "-c",
                        "import affinity.machine._native as n, affinity.binding.apply; n.lib()"],
                       capture_output=True, text=True, timeout=120, cwd=cwd)
    if r.returncode != 0:
        return (f"{ident} cannot run {sys.executable} with affinity's compiled core "
                f"(the interpreter or the checkout is not readable by that user): "
                f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return ""


@contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory every identity can read and write (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="affinity-unpriv-"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def build_deny(dst: Path) -> tuple[Path, Path]:
    """``(program, library)``: the seccomp filter as ``deny MODE CMD...`` and as
    ``deny_mempolicy(mode)`` in a shared library."""
    src = dst / "deny.c"
    src.write_text(DENY_C)
    cc = shutil.which("gcc") or shutil.which("cc") or "cc"
    prog, lib = dst / "deny", dst / "libdeny.so"
    subprocess.run([cc, "-O1", "-DDENY_MAIN", str(src), "-o", str(prog)], check=True)
    subprocess.run([cc, "-O1", "-fPIC", "-shared", str(src), "-o", str(lib)], check=True)
    for p in (prog, lib, src):
        p.chmod(0o755)
    # the filter works: get_mempolicy says EPERM under it
    r = subprocess.run([str(prog), "docker", sys.executable, "-c",
                        "import ctypes,os; l=ctypes.CDLL(None, use_errno=True); "
                        f"print(l.syscall({239 if os.uname().machine == 'x86_64' else 236}, "
                        "ctypes.byref(ctypes.c_int()), None, 0, None, 0), ctypes.get_errno())"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["-1", "1"], (r.stdout, r.stderr)
    return prog, lib


@contextmanager
def process_of_another_user(ident: Identity) -> Iterator[int]:
    """The PID of a live process that ``ident`` does not own."""
    if os.geteuid() == 0:
        owner = () if ident.uid != 0 else (shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}",
                                           f"--regid={NOBODY}", "--clear-groups", "--")
        p = subprocess.Popen([*owner, "sleep", "600"])
        try:
            yield p.pid
        finally:
            p.kill()
            p.wait()
        return
    for pid in sorted(int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
                yield pid
                return
        except OSError:
            continue
    raise LookupError("no process of another user is visible")


def thread_policy(tid: int | None = None) -> str:
    """A thread's memory policy, read by the kernel for us (no get_mempolicy, which a
    filter may refuse): the policy shown for its stack, which has none of its own."""
    path = f"/proc/self/task/{tid or os.getpid()}/numa_maps" if tid else "/proc/thread-self/numa_maps"
    with open(path) as fh:
        for line in fh:
            words = line.split()
            if "stack" in words:
                return words[1]
    raise LookupError(f"no stack mapping in {path}")
