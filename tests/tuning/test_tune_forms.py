"""A configuration as ``affinity run`` words, environment and ``apply`` call: the words
come from the launcher's own inverse of its parser, so they parse back to the options
the tuner meant; the typed :class:`Config` reads a configuration once."""

from __future__ import annotations

import argparse
import itertools

import pytest

from affinity.cpulist import IdList
from affinity.launcher.options import RunOptions, options_from_args, run_parser
from affinity.machine.topology import Topology
from affinity.planning.spec import DEFAULT_SPEC
from affinity.tuning import forms
from affinity.tuning.config import Config


def _parse(words, environ=None):
    parser = argparse.ArgumentParser(prog="affinity")
    run_parser(parser.add_subparsers(dest="command"))
    return options_from_args(parser.parse_args(["run", *words]), environ=environ or {})


OPTIONS = [
    RunOptions(command=("echo", "hi")),
    RunOptions(command=("x",), spec="granularity=core,scatter", threads=3, instances=2, blocktime="0"),
    RunOptions(command=("x", "--", "-y"), physcpubind=IdList.parse("+0-1", "CPU"), mempolicy="local",
               blocktime=None, verbose=True),
    RunOptions(command=("x",), cpunodebind=IdList.parse("!0", "node"), mempolicy="interleave",
               mem_nodes=IdList.parse("all", "node"), norespect=True, membind_optional=True),
    RunOptions(command=("x",), mempolicy="bind", mem_nodes=IdList.parse("0", "node"), pin_threads=True,
               pin_skip=1, pin_main=False, pin_children=True, cores_per_instance=2, instances=3,
               log_dir="/tmp/d", ranks="1/4"),
    RunOptions(command=("x",), mempolicy="preferred", mem_nodes=IdList.parse("1", "node"), ranks="auto"),
]


@pytest.mark.parametrize("opts", OPTIONS)
def test_the_launchers_words_parse_back_to_the_same_options(opts):
    words = opts.to_words()
    back = _parse(words)
    assert _plain(back) == _plain(opts), words


def test_the_blocktime_word_is_given_where_the_environment_would_change_it():
    opts = RunOptions(command=("x",), blocktime="1")
    assert "--blocktime" not in opts.to_words({})
    words = opts.to_words({"KMP_BLOCKTIME": "200"})  # the user's own KMP_BLOCKTIME would win
    assert words[words.index("--blocktime") + 1] == "1"
    assert _parse(words, {"KMP_BLOCKTIME": "200"}).blocktime == "1"


CONFIGS = [dict(zip(("threads", "affinity", "instances", "blocktime", "membind"), v)) for v in itertools.product(
    (1, 4), ("none", "compact", "granularity=core,scatter,1,0"), (1, 2), (0, 200, "infinite"),
    ("none", "local", "interleave"))]


@pytest.mark.parametrize("config", CONFIGS[::7])
def test_a_trials_words_parse_back_to_its_configuration(config):
    cfg = Config.of(config)
    back = _parse(cfg.run_options(["CMD"]).to_words())
    assert back.threads == config["threads"] and back.instances == config["instances"]
    assert back.blocktime == str(config["blocktime"]) and back.spec == cfg.spec
    assert back.mempolicy == {"none": None}.get(config["membind"], config["membind"])
    assert back.command == ("CMD",)


def test_config_reads_a_configuration_once():
    cfg = Config.of({"omp": 8, "intra": 4, "inter": 2, "env:MALLOC_ARENA_MAX": 2, "batch": 64, "granularity": "core"})
    assert cfg.team == 8 and cfg.spec == "granularity=core,compact,1,0"
    assert cfg.env_overrides() == {"TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "2",
                                   "MALLOC_ARENA_MAX": "2"}
    assert cfg.command_words(["run", "--batch", "{batch}"]) == [
        "env", "TF_NUM_INTRAOP_THREADS=4", "TF_NUM_INTEROP_THREADS=2", "MALLOC_ARENA_MAX=2", "run", "--batch", "64"]
    with pytest.raises(AttributeError):
        cfg.threads = 3  # frozen


def test_the_forms_name_the_launchers_defaults_not_copies():
    assert forms.apply_call({"threads": 2}).splitlines()[1] == f"binding = affinity.apply({DEFAULT_SPEC!r}, threads=2)"
    env = forms.environment({"threads": 2}, Topology.from_synthetic("package:1 [numa] core:4 pu:1"))
    assert env["OMP_NUM_THREADS"] == "2" and "KMP_AFFINITY" in env and env["KMP_BLOCKTIME"]
    assert forms.shell_line({"threads": 2, "env:X": 1}, ["prog"]) == "affinity run -t 2 -- env X=1 prog"


def _plain(o):
    d = dict(o.__dict__)
    for k in ("physcpubind", "cpunodebind", "mem_nodes"):
        d[k] = d[k].text if d[k] is not None else None
    return d


def test_a_single_instance_trial_keeps_the_launch_cache_and_times_only_the_command():
    """No temporary --log-dir for one instance (it would defeat affinity run's launch
    cache); with --time the command is behind a start stamp, so the launcher's start-up
    is not charged."""
    from affinity.tools.tune_runner import CommandRunner

    runner = CommandRunner(["prog", "x"])
    argv = runner.trial_argv({"threads": 2})
    assert "--log-dir" not in argv and argv[-2:] == ["prog", "x"]
    timed = CommandRunner(["prog"], use_time=True)
    try:
        argv = timed.trial_argv({"threads": 2})
        assert argv[argv.index("--") + 1:argv.index("--") + 3] == ["sh", "-c"] and argv[-1] == "prog"
    finally:
        timed.close()


def test_apply_form_places_tuned_dataloader_workers():
    """The apply() form passes a tuned ``dataloader_workers`` as apply()'s own keyword (and
    only when it is tuned), and names the DataLoader's num_workers to match."""
    import ast
    import inspect

    import affinity

    text = forms.apply_call({"threads": 2, "dataloader_workers": 3})
    call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "apply")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert kw == {"threads": 2, "dataloader_workers": 3}
    assert set(kw) <= set(inspect.signature(affinity.apply).parameters)
    assert "num_workers=3" in text
    assert "dataloader_workers" not in forms.apply_call({"threads": 2})
