"""One bounded range parser and one validated id type (issue 24, items 2 and 9).

Before: ``parse_list("0-99999999")`` expanded the range (``affinity run --physcpubind
0-99999999`` ran 85 s and reached 16.5 GB), ``{1.5}``/``{True}`` bound CPU 1 and
``'٣'`` was CPU 3.  Every check here is on memory, call counts or results, never on time.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tracemalloc

import pytest

from affinity.cpulist import MAX_CPUS, MAX_NODES, IdList, check_id, check_ids, format_list, parse_list
from affinity.errors import AffinityError, SpecError


def _peak(fn, *a):
    tracemalloc.start()
    try:
        try:
            fn(*a)
        except AffinityError as e:
            err = e
        else:
            err = None
        return tracemalloc.get_traced_memory()[1], err
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("text", ["0-99999999", "0-99999999999", "5-8192", "0-18446744073709551616",
                                  "1-" + "9" * 5000, "0-4,8191-100000000:1"])
def test_huge_range_refused_before_expansion(text):
    peak, err = _peak(parse_list, text)
    assert isinstance(err, SpecError) and isinstance(err, ValueError)
    assert "out of range" in str(err) and "\n" not in str(err)
    assert peak < 1 << 20  # bytes: nothing was expanded (the range alone would be GBs)


def test_bounds_per_kind():
    assert parse_list(f"0-{MAX_CPUS - 1}") == frozenset(range(MAX_CPUS))
    with pytest.raises(SpecError, match="node ids are 0 to 1023"):
        parse_list(f"0-{MAX_NODES}", "node")
    assert parse_list("0-9", "node", limit=10) == frozenset(range(10))
    with pytest.raises(SpecError):
        parse_list("10", limit=10)
    assert parse_list("0-8:4,10") == {0, 4, 8, 10}
    assert parse_list("0-8:99999999999") == {0}  # a huge stride is harmless: one id


@pytest.mark.parametrize("text", ["٣", "²", "1-٣", "0x3", "-1", "1e3", "3:0", " ", "1,,2", "+1"])
def test_only_ascii_digits(text):
    if text == " ":
        assert parse_list(text) == frozenset()
        return
    with pytest.raises(SpecError):
        parse_list(text)


@pytest.mark.parametrize("what,text", [("CPU", "0-99999999"), ("node", "0-99999999"), ("CPU", "+0-99999999"),
                                       ("CPU", "!0-99999999"), ("node", "٣")])
def test_idlist_bounded(what, text):
    peak, err = _peak(IdList.parse, text, what)
    assert isinstance(err, SpecError) and peak < 1 << 20


@pytest.mark.parametrize("bad", [1.5, True, False, "3", "٣", -1, MAX_CPUS, 10**6, 2**64, None, b"1"])
def test_check_id_refuses(bad):
    with pytest.raises(SpecError, match="set_affinity"):
        check_id(bad, where="set_affinity")


def test_check_id_accepts_index_types():
    class Idx:
        def __index__(self):
            return 7
    assert check_id(7) == 7 and check_id(Idx()) == 7 and check_id(MAX_CPUS - 1) == MAX_CPUS - 1
    assert check_ids([0, 1, 1]) == {0, 1}
    with pytest.raises(SpecError, match="string"):
        check_ids("12")
    with pytest.raises(SpecError):
        check_ids({1.5})
    with pytest.raises(SpecError):
        check_ids({True})
    assert format_list(check_ids(range(4))) == "0-3"


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # 2 GiB: the old parser needed 16.5 GB
    resource.setrlimit(resource.RLIMIT_CPU, (60, 60))  # the old parser ran 85 s of CPU


@pytest.mark.parametrize("argv", [["run", "--physcpubind", "0-99999999", "--", "true"],
                                  ["run", "-C", "٣", "--", "true"],
                                  ["run", "--membind", "0-99999999", "--", "true"],
                                  ["plan", "compact", "--mask", "0-99999999999", "--topology",
                                   "synthetic:pack:1 core:2 pu:1"]])
def test_cli_refuses_in_one_line(argv):
    r = subprocess.run([sys.executable, "-m", "affinity", *argv], capture_output=True, text=True,
                       preexec_fn=_limits, timeout=120)
    assert r.returncode not in (0, -9, -24), r  # refused, not killed by the limits
    assert "Traceback" not in r.stderr, r.stderr
    assert "out of range" in r.stderr or "bad CPU number '٣'" in r.stderr, r.stderr


def test_check_ids_of_one_id_asks_for_a_set():
    from affinity.errors import ArgumentTypeError

    with pytest.raises(ArgumentTypeError) as ei:  # was "'int' object is not iterable"
        check_ids(3, "node", where="set_membind")
    assert str(ei.value) == "set_membind: expected a set of node ids ({3} for one), got int 3"
    assert isinstance(ei.value, TypeError)
    with pytest.raises(ArgumentTypeError, match=r"^expected a set of CPU ids \(\{None\} for one\), got NoneType"):
        check_ids(None)
