"""The pytest plugin: run a test once per binding and compare the bindings side by side.

Installing the package registers it (entry point ``pytest11``, name ``affinity``; turn
it off with ``-p no:affinity``).  It does nothing unless a test asks for it: loading it
imports neither affinity's compiled core nor TensorFlow, and a test that uses neither
the marker nor the fixture runs as if it were not there.

* ``@pytest.mark.affinity("granularity=fine,compact,1,0", "scatter", threads=2)`` runs the
  test once per spec, each case inside ``affinity.pinned(spec, **keywords)`` (the
  marker's keywords: ``threads=``, ``membind=``, ``tensorflow=``... go to
  :func:`affinity.apply`), restored when the case ends;
* the fixture ``affinity_binding`` is that case's :class:`~affinity.Binding`; a test that
  uses it without the marker runs once per ``--affinity SPEC`` (repeatable; default:
  once, with :data:`~affinity.planning.spec.DEFAULT_SPEC`);
* a case that fails gets this process's bind map, taken before the restore, as a
  section of its report;
* with pytest-benchmark, each case is its own benchmark named after its spec
  (``test_step[scatter]``), grouped by test (``--benchmark-group-by=group``, the
  default) so that the bindings of one test sit side by side, with the plan and the
  machine's topology in ``extra_info["affinity"]``; at the end of the session a
  summary says each binding against the test's first, with the statistic every
  face of the package prints a speed-up with (:mod:`affinity.tuning.verdict`: the
  ratio of the geometric means of the rounds, its interval, and "faster"/"slower"
  only when the interval excludes 1).  pytest-benchmark runs one case's rounds
  before the next case's, so the samples are unpaired and a change of the
  machine's load between two cases reads as a difference: the summary says so.

* the fixture ``affinity_doctor`` checks placement (:func:`affinity.doctor`):
  ``affinity_doctor()`` returns the :class:`~affinity.planning.doctor.values.Diagnosis`
  of this process (or of PIDs), ``affinity_doctor.assert_clean(during=step)`` fails
  the test with each finding's evidence and fix when one is an error.

The cases are parametrized under the name ``affinity_binding``: ``-k scatter`` selects
one binding, ``--benchmark-group-by=param:affinity_binding`` puts each binding's tests
together instead.  See ``docs/pytest.md``.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["DOCTOR_FIXTURE", "Doctor", "FIXTURE", "MARKER", "affinity_binding", "affinity_doctor"]

#: the marker's name: ``@pytest.mark.affinity(*specs, **pinned_keywords)``
MARKER = "affinity"
#: the fixture, and the parameter each case is parametrized under
FIXTURE = "affinity_binding"
#: the fixture that checks where this process's threads and memory are
DOCTOR_FIXTURE = "affinity_doctor"
#: the report section that carries the bind map of a failing case
SECTION = "affinity bind map"

_BINDING = pytest.StashKey[Any]()  # the active Binding of an item, while its case runs
_MEASURED = pytest.StashKey[list]()  # (group, spec, benchmark fixture) of each case that benchmarked


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("affinity", "thread placement (affinity)")
    group.addoption("--affinity", action="append", default=[], metavar="SPEC", dest="affinity_specs",
                    help="run each test that uses the affinity_binding fixture and has no affinity "
                         "marker once per SPEC (a KMP_AFFINITY string or KEY=VALUE settings), inside "
                         "affinity.pinned(SPEC); repeatable")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*specs, threads=None, membind=None, tensorflow='auto', ...): run the test once per "
        "spec inside affinity.pinned(spec, **keywords), restored after each case; the case's Binding "
        f"is the {FIXTURE} fixture")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One case per spec for a marked test, or for one that uses the fixture."""
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None and FIXTURE not in metafunc.fixturenames:
        return  # not ours: nothing changes
    specs = list(marker.args) if marker is not None else []
    if not specs:
        specs = list(metafunc.config.getoption("affinity_specs"))
    if not specs:
        from ..planning.spec import DEFAULT_SPEC  # lazy: pure, but only tests that use the plugin load it

        specs = [DEFAULT_SPEC]
    # the binding is set up before the test's other fixtures, so that a model or
    # session they build (and the TensorFlow runtime it starts) lives inside it
    names = metafunc.fixturenames
    if FIXTURE in names:
        names.remove(FIXTURE)
    names.insert(0, FIXTURE)
    metafunc.parametrize(FIXTURE, specs, indirect=True, ids=[str(s) for s in specs])


@pytest.fixture
def affinity_binding(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The :class:`~affinity.Binding` this case runs under, restored when it ends.

    The spec is the case's parameter (the marker's, or ``--affinity``'s); the marker's
    keywords go to :func:`affinity.pinned`.
    """
    from ..binding.apply import pinned  # lazy: the compiled core loads only when a test asks for a binding

    spec = getattr(request, "param", None)
    if spec is None:  # requested by name from another fixture, outside the parametrization
        from ..planning.spec import DEFAULT_SPEC  # lazy: see pytest_generate_tests

        spec = DEFAULT_SPEC
    marker = request.node.get_closest_marker(MARKER)
    keywords = dict(marker.kwargs) if marker is not None else {}
    with _at_marker(request.node):
        block, binding = _enter(pinned, spec, keywords)
    try:
        request.node.stash[_BINDING] = binding
        _describe_benchmark(request, spec, keywords, binding)
        yield binding
    finally:
        if _BINDING in request.node.stash:
            del request.node.stash[_BINDING]
        block.__exit__(None, None, None)


class Doctor:
    """The ``affinity_doctor`` fixture: :func:`affinity.doctor` for a test.

    ``affinity_doctor(*pids, interval=0.2, during=None)`` returns the diagnosis
    (default: this process, sampled ``interval`` seconds or while ``during()`` runs);
    ``affinity_doctor.assert_clean(...)`` also fails the test, in one report listing
    each finding's evidence and fix, when a finding is an error (``warnings=True``:
    any finding) whose kind is not in ``allow``.

    Examples
    --------
    >>> def test_training_step_is_placed(affinity_doctor):     # doctest: +SKIP
    ...     affinity.apply()
    ...     affinity_doctor.assert_clean(during=lambda: train_step(batch))
    """

    def __init__(self, doctor: Any):
        self._doctor = doctor

    def __call__(self, *pids: int, interval: float = 0.2, during: Any = None, children: bool = True) -> Any:
        return self._doctor(*pids, interval=interval, during=during, children=children)

    def assert_clean(self, *pids: int, allow: tuple[str, ...] = (), warnings: bool = False, interval: float = 0.2,
                     during: Any = None, children: bool = True) -> Any:
        found = self(*pids, interval=interval, during=during, children=children)
        bad = [f for f in found.findings if f.kind not in allow and (warnings or f.severity == "error")]
        if bad:
            pytest.fail("affinity doctor: " + f"{len(bad)} finding{'s' if len(bad) != 1 else ''}\n"
                        + "\n".join(f.text() for f in bad) + f"\n({found.checked})", pytrace=False)
        return found


@pytest.fixture
def affinity_doctor() -> Doctor:
    """:class:`Doctor`: check this process's placement (or other processes') in a test."""
    from ..binding.doctor import doctor  # lazy: the compiled core loads only when a test asks for it

    return Doctor(doctor)


def _enter(pinned: Any, spec: Any, keywords: dict[str, Any]) -> tuple[Any, Any]:
    """Enter ``pinned(spec, strict=True, **keywords)``: a spec the runtime would not
    read (a typo: it would bind nothing) fails the case in one line instead of
    benchmarking it unbound; ``strict=False`` in the marker reads it as the runtime does."""
    from ..errors import SpecError  # lazy: see affinity_binding

    block = pinned(spec, **{"strict": True, **keywords})
    try:
        return block, block.__enter__()
    except SpecError as e:
        reason = f"affinity spec {str(spec)!r}: {str(e).splitlines()[0]}"
    pytest.fail(reason, pytrace=False)  # outside the except: no chained traceback


@contextlib.contextmanager
def _at_marker(item: pytest.Item) -> Iterator[None]:
    """Warnings raised while the case's binding is applied (an oversubscribed thread
    count, a setting kept...) point at the test's ``affinity`` marker, the line the
    user wrote, rather than at this plugin."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    filename, lineno = marker_location(item)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, filename, lineno,
                               module=getattr(getattr(item, "module", None), "__name__", None))


def marker_location(item: pytest.Item) -> tuple[str, int]:
    """(file, line) of the test's ``affinity`` marker: the decorator line when the
    test has one, else the test's ``def`` (a marker set elsewhere, or ``--affinity``)."""
    fn = getattr(item, "function", None)
    code = getattr(fn, "__code__", None)
    if code is None:
        path, line, _ = item.location
        return str(item.path), (line or 0) + 1
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return code.co_filename, code.co_firstlineno
    for i, text in enumerate(lines):
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")):
            return code.co_filename, first + i
        if stripped.startswith("@") and f"{MARKER}(" in stripped:
            return code.co_filename, first + i
    return code.co_filename, code.co_firstlineno


def _describe_benchmark(request: pytest.FixtureRequest, spec: Any, keywords: dict[str, Any],
                        binding: Any) -> None:
    """Group a pytest-benchmark case with the test's other bindings and record what it ran on."""
    if "benchmark" not in request.fixturenames:
        return
    bench = request.getfixturevalue("benchmark")
    if not hasattr(bench, "extra_info"):  # a fixture of the user's own called "benchmark"
        return
    if getattr(bench, "group", None) is None:  # an explicit @pytest.mark.benchmark(group=) wins
        bench.group = group_name(request.node)
    request.config.stash.setdefault(_MEASURED, []).append((bench.group, str(spec), bench))
    bench.extra_info["affinity"] = {
        "spec": str(spec),
        "keywords": {k: v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
                     for k, v in keywords.items()},
        "plan": binding.plan.to_dict(),
        "topology": binding.plan.topology.to_dict(),
    }


def group_name(item: pytest.Item) -> str:
    """The benchmark group of a case: its test, with its other parameters but not the
    binding (``test_x.py::test_step[batch=32]``)."""
    base = f"{item.parent.nodeid}::{getattr(item, 'originalname', item.name)}"
    callspec = getattr(item, "callspec", None)
    others = {k: v for k, v in callspec.params.items() if k != FIXTURE} if callspec is not None else {}
    return base + (f"[{','.join(f'{k}={v}' for k, v in others.items())}]" if others else "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing case's report carries the bind map, taken while its binding is active."""
    outcome = yield
    report = outcome.get_result()
    binding = item.stash.get(_BINDING, None)
    if binding is None or not report.failed or not binding.active:
        return
    try:
        text = str(binding.report())
    except Exception as e:  # noqa: BLE001  the report must not hide the failure it documents
        text = f"(no bind map: {type(e).__name__}: {e})"
    spec = item.callspec.params.get(FIXTURE) if hasattr(item, "callspec") else None
    report.sections.append((f"{SECTION} ({spec})" if spec is not None else SECTION,
                            f"{binding!r}\n{text}"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Each benchmarked binding against the first binding of its test (:func:`summary_lines`)."""
    measured = config.stash.get(_MEASURED, [])
    groups: dict[str, list[tuple[str, list[float]]]] = {}
    for group, spec, bench in measured:
        data = list(getattr(getattr(getattr(bench, "stats", None), "stats", None), "data", None) or [])
        if data:
            groups.setdefault(group, []).append((spec, data))
    lines = summary_lines(groups)
    if lines:
        terminalreporter.write_sep("-", "affinity: bindings side by side")
        for line in lines:
            terminalreporter.write_line(line)


def summary_lines(groups: dict[str, list[tuple[str, list[float]]]]) -> list[str]:
    """The summary of the bindings of each test (``group -> [(spec, round times)]``, in
    the order the cases ran): each binding's figure (the geometric mean of its rounds'
    times) and its verdict against the first binding
    (:func:`affinity.tuning.verdict.unpaired`; the bindings after the first share the
    level).  Tests with one binding are left out."""
    from ..tuning.verdict import geomean, unpaired  # lazy: only a session that benchmarked bindings

    out: list[str] = []
    for group, cases in groups.items():
        if len(cases) < 2:
            continue
        ref_spec, ref = cases[0]
        scale, unit = _time_unit(geomean(ref))
        out.append(f"{group}: time per round, lower is better; figures are geometric means of the rounds; each "
                   f"binding against {ref_spec} (cases run one after another, not interleaved: a change of load "
                   f"between them reads as a difference)")
        width = max(len(spec) for spec, _ in cases)
        for k, (spec, data) in enumerate(cases):
            said = "reference" if k == 0 else unpaired(ref, data, "minimize", family=len(cases) - 1).text
            out.append(f"  {spec.ljust(width)}  {geomean(data) * scale:10.3f} {unit}  {said}")
    return out


def _time_unit(seconds: float) -> tuple[float, str]:
    for scale, unit in ((1e6, "us"), (1e3, "ms")):
        if seconds * scale < 1000:
            return scale, unit
    return 1.0, "s"
