"""affinity.record: the same classes as dataclasses', without their start-up cost.

Every behaviour is checked against the dataclass declared the same way."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import ClassVar

import pytest

from affinity import record
from affinity.errors import FrozenInstanceError


def _pair(frozen: bool = True, eq: bool = True, slots: bool = False):
    """The same class as a dataclass and as a record."""
    def body():
        class Point:
            """A point."""
            x: int
            y: int = 2
            tags: tuple = dataclasses.field(default_factory=tuple) if dc else record.field(default_factory=tuple)
            note: str = (dataclasses.field(default="n", repr=False, compare=False) if dc
                         else record.field(default="n", repr=False, compare=False))
            hidden: list = (dataclasses.field(default_factory=list, init=False, repr=False, compare=False) if dc
                            else record.field(default_factory=list, init=False, repr=False, compare=False))
            KIND: ClassVar[str] = "point"

            def norm(self) -> int:
                return abs(self.x) + abs(self.y)
        return Point

    dc = True
    a = dataclasses.dataclass(frozen=frozen, eq=eq, slots=slots)(body())
    dc = False
    b = record.record(frozen=frozen, eq=eq, slots=slots)(body())
    return a, b


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize("eq", [True, False])
@pytest.mark.parametrize("slots", [True, False])
def test_a_record_behaves_as_the_same_dataclass(frozen: bool, eq: bool, slots: bool) -> None:
    D, R = _pair(frozen, eq, slots)
    for args, kwargs in [((1,), {}), ((1, 5), {}), ((), {"x": 3, "tags": (1,)}), ((1, 2, (3,), "m"), {})]:
        d, r = D(*args, **kwargs), R(*args, **kwargs)
        assert repr(d) == repr(r)
        assert [getattr(d, f.name) for f in dataclasses.fields(d)] == [getattr(r, f.name) for f in record.fields(r)]
        assert (d == D(*args, **kwargs)) == (r == R(*args, **kwargs))
        assert r.norm() == d.norm() and R.KIND == "point"
        if frozen and eq:
            assert hash(d) == hash(r)  # the same hash: sets of records iterate as before
        assert (D.__hash__ is None) == (R.__hash__ is None)
    assert str(inspect.signature(D)) == str(inspect.signature(R))
    assert [f.name for f in record.fields(R)] == ["x", "y", "tags", "note", "hidden"]
    assert R(1, note="a") == R(1, note="b") if eq else R(1) != R(1)
    with pytest.raises(TypeError):
        R()  # x has no default
    with pytest.raises(TypeError):
        R(1, hidden=[])  # init=False


def test_frozen_records_refuse_assignment_and_replace_copies() -> None:
    _, R = _pair()
    r = R(1, tags=(4,))
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'x'"):
        r.x = 2
    with pytest.raises(AttributeError):  # as dataclasses' FrozenInstanceError is
        del r.y
    s = record.replace(r, y=7)
    assert (s.x, s.y, s.tags) == (1, 7, (4,)) and r.y == 2
    with pytest.raises(ValueError, match="'hidden'"):
        record.replace(r, hidden=[1])
    with pytest.raises(TypeError, match="not a record"):
        record.replace(object(), x=1)


def test_mutable_records_assign_and_are_unhashable() -> None:
    _, R = _pair(frozen=False)
    r = R(1)
    r.x = 5
    assert r == R(5)
    with pytest.raises(TypeError):
        hash(r)


def test_asdict_converts_nested_records_like_dataclasses() -> None:
    @record.record
    class Inner:
        a: int

    @record.record
    class Outer:
        items: tuple
        by_name: dict
        one: Inner

    o = Outer((Inner(1), Inner(2)), {"k": [Inner(3)]}, Inner(4))
    assert record.asdict(o) == {"items": ({"a": 1}, {"a": 2}), "by_name": {"k": [{"a": 3}]}, "one": {"a": 4}}
    with pytest.raises(TypeError):
        record.asdict({"a": 1})


def test_post_init_runs_and_may_set_fields_of_a_frozen_record() -> None:
    @record.record
    class Span:
        lo: int
        hi: int
        width: int = record.field(default=0, init=False)

        def __post_init__(self) -> None:
            if self.hi < self.lo:
                raise ValueError("hi < lo")
            object.__setattr__(self, "width", self.hi - self.lo)

    assert Span(2, 5).width == 3
    with pytest.raises(ValueError):
        Span(5, 2)


def test_declarations_dataclasses_refuse_are_refused() -> None:
    with pytest.raises(ValueError, match="mutable default list"):
        @record.record
        class A:
            x: list = []  # noqa: RUF012

    with pytest.raises(TypeError, match="non-default argument 'y' follows default argument"):
        @record.record
        class B:
            x: int = 1
            y: int

    @record.record
    class C:
        x: int

    with pytest.raises(TypeError, match="cannot derive from another record"):
        @record.record
        class D(C):
            y: int


def test_methods_the_class_writes_are_kept() -> None:
    @record.record
    class Named:
        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

        def __hash__(self) -> int:
            return 7

    assert repr(Named("a")) == "<a>" and hash(Named("a")) == 7


@record.record(slots=True)
class Slotted:
    a: int
    b: tuple = record.field(default_factory=tuple)


def test_slotted_records_pickle_and_have_no_dict() -> None:
    r = Slotted(1, (2,))
    assert not hasattr(r, "__dict__")
    assert pickle.loads(pickle.dumps(r)) == r


def test_init_is_compiled_only_when_first_looked_up() -> None:
    @record.record
    class Lazy:
        a: int
        b: str = "x"

    assert type(Lazy.__dict__["__init__"]).__name__ == "_InitOnFirstUse"
    assert str(inspect.signature(Lazy)) == "(a: 'int', b: 'str' = 'x') -> None"  # as dataclasses'
    assert inspect.isfunction(Lazy.__dict__["__init__"])  # looked up once: now the real one, in place
    assert Lazy(1).b == "x"


def _errors(cls, calls) -> list[str]:
    out = []
    for args, kwargs in calls:
        try:
            cls(*args, **kwargs)
            out.append("ok")
        except TypeError as e:
            out.append(str(e))
    return out


def test_the_generic_init_binds_arguments_as_the_compiled_one_does() -> None:
    """A record's first instances are made without compiling anything; the
    arguments are bound, and refused, exactly as by the compiled __init__."""
    def make():
        @record.record
        class Three:
            a: int
            b: int
            c: int = 3
            tags: tuple = record.field(default_factory=tuple)
            hidden: list = record.field(default_factory=list, init=False)
        return Three

    calls = [((), {}), ((1,), {}), ((1, 2),), ((1, 2, 3, (4,), 5), {}), ((1, 2, 3, (4,), 5, 6), {}),
             ((1,), {"a": 2, "b": 3}), ((1, 2), {"z": 1}), ((), {"b": 1, "c": 2}), ((1, 2), {"hidden": []})]
    calls = [c if len(c) == 2 else (c[0], {}) for c in calls]
    generic, compiled = make(), make()
    compiled.__init__  # looked up on the class: compiled now
    assert type(generic.__dict__["__init__"]).__name__ == "_InitOnFirstUse"
    assert _errors(generic, calls) == _errors(compiled, calls)
    assert type(generic.__dict__["__init__"]).__name__ == "_InitOnFirstUse"  # errors made no instance
    g, c = generic(1, 2), compiled(1, 2)
    assert (g.a, g.b, g.c, g.tags, g.hidden) == (c.a, c.b, c.c, c.tags, c.hidden) == (1, 2, 3, (), [])
    assert generic(1, 2).hidden is not g.hidden  # a factory per instance


def test_the_real_init_is_compiled_after_a_few_instances() -> None:
    @record.record(slots=True)
    class Many:
        a: int
        b: int = 0

    made = [Many(i) for i in range(record.COMPILE_AFTER)]
    assert type(Many.__dict__["__init__"]).__name__ == "_InitOnFirstUse"
    made.append(Many(99, b=1))
    assert inspect.isfunction(Many.__dict__["__init__"])
    assert [m.a for m in made[-2:]] == [record.COMPILE_AFTER - 1, 99] and made[-1].b == 1


def test_a_launch_compiles_nothing() -> None:
    """No code of ours made at run time while ``affinity run`` plans (the first
    compile() of a process costs 0.8 ms): every record it makes is made by the
    generic __init__ (a machine's cgroup mounts are the most numerous: tens).  The
    standard library's own (``shutil``'s namedtuple) are not ours to avoid."""
    import subprocess
    import sys

    code = r'''
import os, sys
compiled = []
def hook(ev, args):  # code made at run time (a module's source compiled on import is not), by our code
    if ev == "compile" and str(args[1]).startswith("<"):
        f = sys._getframe(1)  # the code that called compile()/exec()/eval()
        if "/affinity/" in f.f_code.co_filename.replace(os.sep, "/"):
            compiled.append(f"{args[1]} from {f.f_code.co_filename}:{f.f_lineno}")
sys.addaudithook(hook)
def stop(*a, **k):
    print(compiled)
    os._exit(0)
os.execve = os.execv = stop
import affinity.tools.cli as cli
cli.main(["run", "--", "true"])
'''
    env = dict(__import__("os").environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
