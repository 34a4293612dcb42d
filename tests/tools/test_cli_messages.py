"""What a new user reads: answers first, one-line errors instead of tracebacks, usage
errors exit 2, and the API and the CLI saying the same thing about the same mistake."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import affinity
from affinity.errors import PlanError
from affinity.machine.topology import Topology
from helpers import golden_dir

SMALL = "synthetic:pack:1 core:2 pu:1"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "affinity", *args], capture_output=True, text=True,
                          timeout=120)


def one_line_error(r: subprocess.CompletedProcess, status: int) -> str:
    assert r.returncode == status, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr


def test_plan_leads_with_the_answer_and_keeps_the_verbose_map_behind_v():
    xeon = "synthetic:pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"
    r = run("plan", "granularity=fine,scatter", "-t", "4", "--topology", xeon)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("plan: granularity=fine,scatter on 2 packages x 28 cores x 2 PUs "
                        "(112 PUs, 2 NUMA nodes) (intel's rules)")
    assert lines[1] == "4 threads, scatter at thread granularity (proc_bind intel):"
    assert lines[2:] == ["  thread 0 -> {0}", "  thread 1 -> {28}", "  thread 2 -> {1}", "  thread 3 -> {29}"]
    verbose = run("plan", "granularity=fine,scatter", "-t", "4", "--topology", xeon, "-v").stdout
    assert verbose.startswith(r.stdout) and "OS proc 111 maps to" in verbose


def test_singular_and_plural():
    r = run("plan", "compact", "-t", "1", "--topology", SMALL)
    assert r.stdout.splitlines()[:2] == ["plan: compact on 1 package x 2 cores x 1 PU (2 PUs, 1 NUMA node) "
                                         "(intel's rules)",
                                         "1 thread, compact at core granularity (proc_bind intel):"]
    r = run("run", "-C", "5", "--dry-run", "--", "true")
    assert "--physcpubind 5: CPU 5 does not exist on this machine" in one_line_error(r, 1)


def test_paths_the_user_names_fail_in_one_line(tmp_path):
    (tmp_path / "taken.svg").mkdir()  # passes the check before the work (a writable folder), fails at the write
    r = run("plan", "compact", "--topology", SMALL, "--picture", str(tmp_path / "taken.svg"))
    err = one_line_error(r, 1)
    assert err == (f"affinity plan: error: cannot write the picture {tmp_path / 'taken.svg'}: "
                   "Is a directory\n")
    r = run("show", "--picture", "/nonexistent/dir/x.png")  # a folder that is not there: before any work
    assert r.returncode == 2 and "'/nonexistent/dir/x.png': folder /nonexistent/dir does not exist" in r.stderr
    r = run("topology", "--topology", str(tmp_path))
    assert one_line_error(r, 1) == f"affinity topology: error: {tmp_path}: is a folder, not a regular file\n"
    ok = run("plan", "compact", "--topology", SMALL, "--picture", str(tmp_path / "p.svg"))
    assert ok.returncode == 0 and f"picture written to {tmp_path / 'p.svg'}" in ok.stderr


@pytest.mark.parametrize("args, says", [
    (("plan", "compact", "--env", "FOO"), "--env: expected KEY=VALUE"),
    (("plan", "compact", "--mask", "9-x"), "--mask 9-x: bad CPU number 'x'"),
    (("run", "--ranks", "bogus", "--", "true"), "argument --ranks: expected 'auto' or RANK/SIZE"),
    (("run", "--ranks", "4/4", "--", "true"), "RANK < SIZE"),
])
def test_usage_errors_exit_2(args, says):
    r = run(*args)
    err = one_line_error(r, 2)
    assert says in err and ("usage:" in err or "--help" in err)


@pytest.mark.parametrize("args, says", [
    (("plan", "compact", "-t", "0"), "argument --threads/-t: expected a positive integer, got '0'"),
    (("plan", "--ranks", "abc"), "argument --ranks: expected a positive rank count or 'auto', got 'abc'"),
    (("plan", "--ranks", "0"), "argument --ranks: expected a positive rank count or 'auto', got '0'"),
    (("plan", "--dataloader-workers", "0"), "argument --dataloader-workers: expected a positive integer, got '0'"),
    (("plan", "--runtime", "gnuu"),
     "argument --runtime: unknown runtime 'gnuu': expected one of intel, llvm, gnu, gnu-torch, auto"),
    (("plan", "--compare", "auto"), "argument --compare: unknown runtime 'auto': expected one of intel, llvm, "
                                    "gnu, gnu-torch"),
    (("run", "--runtime", "gnuu", "--", "true"),
     "argument --runtime: unknown runtime 'gnuu': expected one of intel, llvm, gnu, gnu-torch, auto"),
    (("show", "-5"), "argument pid: expected a positive integer, got '-5'"),
])
def test_every_bad_option_value_is_a_usage_error_as_in_run(args, says):
    """plan's values are checked by its parser, as run's are: exit 2, the command's usage and one
    error line naming the option (plan -t 0 was a failure, exit 1; --dataloader-workers 0 named
    an internal function; --compare gnuu planned, exit 0)."""
    r = run(*args)
    err = one_line_error(r, 2)
    assert err.startswith(f"usage: affinity {args[0]} ")
    assert err.splitlines()[-1] == f"affinity {args[0]}: error: {says}"


def test_the_api_and_the_cli_say_the_same_about_a_missing_numa_node():
    nodes = ",".join(str(n.os_index) for n in Topology.from_system().numa_nodes)
    cli = run("run", "--membind", "7", "--", "true").stderr
    assert f"--membind 7: no NUMA node 7 on this machine (nodes: {nodes})" in cli
    for membind in (("bind", {7}), [7], "bind:7"):
        with pytest.raises(PlanError, match=rf"no NUMA node 7 on this machine \(nodes: {nodes}\)"):
            affinity.apply("compact", membind=membind, tensorflow=False, openmp=False, blas=False)
    assert affinity.binding.apply.active_bindings() == []
    with pytest.raises(ValueError, match="unknown memory policy 'sideways'"):
        affinity.apply("compact", membind="sideways:0", tensorflow=False)


def test_a_list_of_nodes_binds_to_them():
    node = Topology.from_system().numa_nodes[0].os_index
    from helpers.threads import in_thread

    def go():
        with affinity.pinned("compact", membind=[node], tensorflow=False, openmp=False, blas=False) as b:
            return str(b.membind)

    assert in_thread(go) == f"bind:{node}"
    assert os.sched_getaffinity(0)  # still alive, nothing left behind


HIDE_TENSORFLOW = r"""
import sys
class Hide:  # what an environment without TensorFlow answers to its import
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
from affinity.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [["bench", "--num-batches", "1"], ["bench", "--pin", "compact"],
                                     ["demo", "--num-batches", "1"]])
def test_a_command_that_needs_tensorflow_says_so_in_one_line_when_it_is_missing(command):
    r = subprocess.run([sys.executable, "-c", HIDE_TENSORFLOW, *command], capture_output=True, text=True,
                       timeout=120)
    err = one_line_error(r, 1)
    assert err == (f"affinity {command[0]}: error: TensorFlow is not installed (no module named "
                   f"'tensorflow'): pip install 'kmp-affinity[tf]'\n")
    assert r.stdout == ""  # the demo fails before it starts, not after the topology


BROKEN_TENSORFLOW = """\
try:  # what TensorFlow's pywrap does when its native library does not load
    raise ImportError("libtensorflow_framework.so.2: cannot open shared object file: No such file or directory")
except ImportError:
    import traceback
    raise ImportError(traceback.format_exc() + "\\n\\nFailed to load the native TensorFlow runtime.\\n"
                      "See https://www.tensorflow.org/install/errors for some common causes and solutions.")
"""


@pytest.mark.parametrize("command", [["bench", "--num-batches", "1"], ["bench", "--pin", "compact"],
                                     ["demo", "--num-batches", "1"]])
def test_a_tensorflow_that_fails_to_import_is_one_line_naming_the_cause(command, tmp_path):
    """A broken install (issue #40, point 7): an ImportError from TensorFlow's own
    import printed a traceback (the demo's from its workload's child process)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(BROKEN_TENSORFLOW)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "affinity", *command], capture_output=True, text=True,
                       timeout=300, env=env)
    err = one_line_error(r, 1)
    assert err == (f"affinity {command[0]}: error: TensorFlow is installed but fails to import (ImportError: "
                   f"libtensorflow_framework.so.2: cannot open shared object file: No such file or directory); "
                   f"python -c 'import tensorflow' shows why\n")
    assert r.stdout == ""


def test_an_import_error_of_no_extra_keeps_its_traceback():
    from affinity.tools.cli import _broken_extra

    def raised(exc):
        try:
            raise exc
        except ImportError as e:
            return e

    assert _broken_extra(raised(ImportError("cannot import name 'x' from 'json'", name="json"))) is None
    assert _broken_extra(raised(ModuleNotFoundError("No module named 'numpyy'", name="numpyy"))) is None
    said = _broken_extra(raised(ImportError("undefined symbol: foo", name="torch._C")))
    assert said.startswith("PyTorch is installed but fails to import (ImportError: undefined symbol: foo)")


def test_a_missing_module_that_is_no_extra_keeps_its_traceback():
    from affinity.tools.cli import _missing_extra

    assert _missing_extra(ModuleNotFoundError("No module named 'numpyy'", name="numpyy")) is None
    assert "kmp-affinity[tune]" in _missing_extra(ModuleNotFoundError("x", name="optuna.samplers"))


@pytest.mark.parametrize("args, says", [
    (("run", "--instanses", "2", "--", "true"), "unrecognized arguments: --instanses (did you mean --instances?)"),
    (("run", "compact", "--instanses", "2", "--", "true"),
     "unrecognized arguments: --instanses (did you mean --instances?)"),
    (("plan", "--typo"), "unrecognized arguments: --typo"),
    (("plan", "compact", "--comapre=gnu"), "unrecognized arguments: --comapre=gnu (did you mean --compare?)"),
    (("topology", "--jsn"), "unrecognized arguments: --jsn (did you mean --json?)"),
])
def test_an_unknown_option_is_said_by_its_command(args, says):
    """The command's usage and name, not the top level's ('usage: affinity [-h] [--version] COMMAND'
    and 'affinity: error:'), and the option a typo was probably meant to be."""
    err = one_line_error(run(*args), 2)
    assert err.startswith(f"usage: affinity {args[0]} ")
    assert err.splitlines()[-1] == f"affinity {args[0]}: error: {says}"


def test_a_spec_holds_libgomps_blank_separated_gomp_cpu_affinity():
    """plan and run read 'GOMP_CPU_AFFINITY=0 2 4 6' as libgomp does (it failed with got '2')."""
    four = "synthetic:pack:1 core:8 pu:1"
    r = run("plan", "GOMP_CPU_AFFINITY=6 4 2 0 OMP_PROC_BIND=true", "-t", "4", "--runtime", "gnu",
            "--topology", four)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[2:6] == ["  thread 0 -> {6}", "  thread 1 -> {4}", "  thread 2 -> {2}",
                                          "  thread 3 -> {0}"]
    r = run("run", "GOMP_CPU_AFFINITY=1 0", "-t", "2", "--runtime", "gnu", "--dry-run", "--json", "--", "true")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["instances"][0]["slots"] == ["1", "0"]


@pytest.mark.parametrize("lenient", [(), ("--lenient",)])
def test_a_mistyped_variable_is_refused_naming_it_as_any_spec_error(lenient):
    """'plan OMP_PLACE=cores' said "KMP_AFFINITY: parameter invalid" (and planned nothing bound with
    --lenient); now the error of 'OMP_PLACES=cores OMP_PROC_BND=spread': exit 1 like every spec error."""
    r = run("plan", "OMP_PLACE=cores", *lenient, "--topology", SMALL)
    err = one_line_error(r, 1)
    assert err.startswith("affinity plan: error: spec: expected KEY=VALUE with KEY one of "), err
    assert "got 'OMP_PLACE=cores'" in err.splitlines()[0]
    assert run("plan", "compakt", "--topology", SMALL).returncode == r.returncode  # as a KMP_AFFINITY typo


def test_the_plan_header_says_the_env_settings_planned():
    """Settings given with --env and no SPEC are what was planned, not 'the runtime defaults'."""
    r = run("plan", "--env", "OMP_PLACES=cores", "--env", "OMP_PROC_BIND=spread", "-t", "2", "--topology", SMALL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("plan: OMP_PLACES=cores OMP_PROC_BIND=spread (--env) on 1 package x 2 cores "
                                        "x 1 PU (2 PUs, 1 NUMA node) (intel's rules)")
    r = run("plan", "--env", "OMP_PLACES=cores", "--compare", "gnu", "-t", "2", "--topology", SMALL)
    assert r.stdout.splitlines()[0] == ("plan: OMP_PLACES=cores (--env) on 1 package x 2 cores x 1 PU (2 PUs, "
                                        "1 NUMA node): intel vs gnu")
    r = run("plan", "-t", "2", "--topology", SMALL)
    assert r.stdout.startswith("plan: the runtime defaults on ")


@pytest.mark.parametrize("args", [("topology", "--numa-nodes", "/x"),
                                  ("plan", "--numa-nodes", "/x", "--topology", SMALL)])
def test_numa_nodes_without_a_cpuinfo_file_is_a_usage_error(args):
    """--numa-nodes only goes with a cpuinfo file: with this machine or a synthetic one it
    was silently dropped (exit 0)."""
    err = one_line_error(run(*args), 2)
    assert err.startswith(f"affinity {args[0]}: error: --numa-nodes /x: goes with a cpuinfo file as --topology")


def test_numa_nodes_with_an_xml_or_json_file_is_a_usage_error(tmp_path):
    """An XML or JSON file holds its own NUMA nodes: --numa-nodes beside one was ignored."""
    xml = golden_dir() / "hwloc" / "2s4c2t_linux.xml"
    js = tmp_path / "m.json"
    js.write_text(Topology.from_synthetic("pack:2 [numa] core:2 pu:1").to_json())
    for path, kind in [(xml, "an hwloc XML file"), (js, "a JSON file of 'affinity topology --json'")]:
        err = one_line_error(run("plan", "--numa-nodes", "/x", "--topology", str(path)), 2)
        assert err.startswith(f"affinity plan: error: --numa-nodes /x: goes with a cpuinfo file as --topology, "
                              f"not with {kind} ({str(path)!r}), which says its own NUMA nodes")


@pytest.mark.parametrize("words", [["plan", "compact"], ["show"]])
@pytest.mark.parametrize("path,says", [("x.bmp", "'x.bmp': write .svg or .png"),
                                       ("/no/such/folder/x.svg", "'/no/such/folder/x.svg': folder /no/such/folder does not exist")])
def test_a_picture_that_cannot_be_written_is_refused_before_any_output(words, path, says):
    """``--picture x.bmp`` printed the whole plan (or bind map), then failed with exit 1."""
    r = subprocess.run([sys.executable, "-m", "affinity", *words, "--picture", path], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert f"affinity {words[0]}: error: argument --picture: {says}" in r.stderr


def test_plan_mask_with_cpus_the_machine_lacks_is_refused_and_a_mask_is_shown():
    """``plan --mask 100-200`` on 112 CPUs planned on 100-111 without a word (``run -C``
    refuses the same list), and the heading did not show the mask."""
    xeon = "synthetic:pack:2 [numa] core:28 pu:2"
    err = one_line_error(run("plan", "scatter", "-t", "2", "--mask", "100-200", "--topology", xeon), 2)
    assert err.startswith("affinity plan: error: --mask 100-200: CPUs 112-200 do not exist on this machine "
                          "(CPUs 0-111)")
    r = run("plan", "scatter", "-t", "2", "--mask", "100-111", "--topology", xeon)
    assert r.stdout.splitlines()[0] == ("plan: scatter on 2 packages x 28 cores x 2 PUs (112 PUs, 2 NUMA nodes) "
                                        "in process mask 100-111 (intel's rules)")
    r = run("plan", "scatter", "-t", "2", "--mask", "0-111", "--compare", "gnu", "--topology", xeon)
    assert r.stdout.splitlines()[0] == ("plan: scatter on 2 packages x 28 cores x 2 PUs (112 PUs, 2 NUMA nodes): "
                                        "intel vs gnu")


# ---- issue #40, point 5: the words a new user tried

def _run_env(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "affinity", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_numactls_c_is_cpunodebind():
    """numactl's -c (and --cpubind) were 'unrecognized arguments: -c'."""
    by_n = run("run", "-N", "0", "--dry-run", "--json", "--", "true")
    assert by_n.returncode == 0, by_n.stderr
    for flag in ("-c", "--cpubind"):
        r = run("run", flag, "0", "--dry-run", "--json", "--", "true")
        assert r.returncode == 0, r.stderr
        assert r.stdout == by_n.stdout


@pytest.mark.parametrize("words", [["--physcpubind=0", "--membind=0", "python", "-c", "print(1)"],
                                   ["--physcpubind=0", "--membind=0", "python", "train.py"],
                                   ["python", "-c", "print(1)"]])
def test_a_command_without_dashes_is_told_to_put_them_before_it(words):
    """'affinity run --physcpubind=0 --membind=0 python -c ...' said 'unrecognized arguments: -c'
    with no word of the missing '--'."""
    import shlex

    bindir = os.path.dirname(sys.executable)
    python = os.path.basename(sys.executable)
    words = [python if w == "python" else w for w in words]
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    err = one_line_error(_run_env("run", *words, env=env), 2)
    command = words[words.index(python):]
    assert err.splitlines()[-1] == (f"affinity run: error: {python!r} is a command, not a SPEC: put '--' before "
                                    f"it (affinity run [SPEC] [options] -- {shlex.join(command)})")


@pytest.mark.parametrize("flags, says", [
    (["-C", "0", "-C", "1"], "argument -C/--physcpubind: given twice (0, then 1): give one list, such as -C 0,1"),
    (["-N", "0", "compact", "-c", "0"], "argument -N/-c/--cpunodebind/--cpubind: given twice (0, then 0): give "
                                        "one list, such as -c 0,0"),
    (["-m", "0", "--membind", "0"], "argument -m/--membind: given twice (0, then 0): give one list, such as "
                                    "--membind 0,0"),
])
def test_a_list_given_twice_is_a_usage_error(flags, says):
    """'-C 0 -C 1' silently kept the last (numactl's way)."""
    err = one_line_error(run("run", *flags, "--dry-run", "--", "true"), 2)
    assert err.splitlines()[-1] == f"affinity run: error: {says}"


def test_a_spec_typo_is_an_error_with_a_did_you_mean_in_plan_and_run():
    for command in ("plan", "run"):
        err = one_line_error(run(command, "compcat", *(["--dry-run", "--", "true"] if command == "run" else [])), 1)
        assert err.splitlines() == [f'affinity {command}: error: KMP_AFFINITY: unknown word "compcat" '
                                    f'(did you mean "compact"?)', "    compcat", "    ^"]


def test_the_ranks_header_in_a_batch_script_is_read_in_lines():
    """Inside sbatch, 'affinity plan --ranks auto' printed its header as one line of ~450 characters."""
    env = {**os.environ, "SLURM_JOB_ID": "42", "SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0"}
    r = _run_env("plan", "--ranks", "auto", "--topology", "synthetic:pack:2 core:4 pu:2", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0] == "2 local ranks on 2 packages x 4 cores x 2 PUs (16 PUs, 1 NUMA node):"
    assert lines[1] == "  Slurm job 42 (SLURM_TASKS_PER_NODE=2, SLURM_NODEID=0): 2 tasks on this node"
    said = " ".join(line.strip() for line in lines[2:lines.index(next(x for x in lines if x.startswith("rank")))])
    assert "'srun --cpu-bind=none affinity run --ranks auto' will start" in said
    short = run("plan", "--ranks", "2", "--topology", "synthetic:pack:2 core:4 pu:2")
    assert short.stdout.splitlines()[0] == "2 local ranks on 2 packages x 4 cores x 2 PUs (16 PUs, 1 NUMA node) " \
                                          "(--ranks 2):"


def test_a_plan_shown_for_pytorch_draws_its_workers_and_says_where_thread_0_goes(tmp_path):
    """Issue #40, point 3: 'affinity plan --dataloader-workers 2 --picture' drew the compute
    threads only, and a plan shown for PyTorch said 'thread 0 -> {0}' where PyTorch's thread
    0 (the main thread) gets all the plan's CPUs, by design."""
    import xml.etree.ElementTree as ET

    machine = "synthetic:pack:1 core:4 pu:2"
    svg = tmp_path / "plan.svg"
    r = run("plan", "compact,1,0", "-t", "3", "--dataloader-workers", "2", "--topology", machine,
            "--picture", str(svg))
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert ("note: under PyTorch thread 0 is the main thread (intra-op thread 0), and apply(), pinned() and "
            "affinity run keep it on all the plan's CPUs {0-5}, not {0-1}") in said
    pus = {g.get("data-os-index"): g.get("data-thread-names")
           for g in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "pu"}
    assert pus["6"] == "w0" and pus["7"] == "w1"  # the workers, where the layout puts them
    assert pus["0"] == pus["1"] == "o0" and pus["4"] == "o2"  # beside the compute threads
    assert "DataLoader worker processes" in svg.read_text() and "2 DataLoader workers" in svg.read_text()
    gnu = run("plan", "OMP_PLACES=cores OMP_PROC_BIND=close", "-t", "2", "--runtime", "gnu-torch",
              "--topology", machine)
    assert "under PyTorch thread 0 is the main thread" in gnu.stdout
    intel = run("plan", "compact,1,0", "-t", "3", "--topology", machine)  # not shown for PyTorch: no note
    assert intel.returncode == 0 and "PyTorch" not in intel.stdout
