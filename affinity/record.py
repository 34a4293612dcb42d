"""Records: classes of named fields, declared as :mod:`dataclasses` declares them,
that cost nothing to define.

``affinity run`` plans a launch in a fresh interpreter, where every class the
planner defines is built again.  :func:`dataclasses.dataclass` compiles five to
six methods per class from source text when the class is defined (about 0.4 ms a
class) and imports :mod:`inspect` (with :mod:`ast`, :mod:`dis`, :mod:`tokenize`)
to do it: with the ~45 classes of the launch path, that was half of the
launcher's start-up.  A record does the same job this way:

* ``__repr__``, ``__eq__``, ``__hash__`` and the frozen ``__setattr__`` are
  written once, here, for every record (they read the class's field table);
* ``__init__`` is the one method that must be compiled for its class (its
  parameters are the fields).  A class's first instances are made by one generic
  ``__init__`` that binds the arguments as the compiled one would; the compiled one
  replaces it after :data:`COMPILE_AFTER` instances, or as soon as something looks
  it up on the class (:func:`inspect.signature`).  A launch thus compiles nothing:
  the first ``compile()`` of a process alone costs 0.8 ms.

What a record does is what the same dataclass does: the same ``__init__``
(positional or keyword, defaults, ``default_factory``, ``init=False``,
``__post_init__``), ``repr`` ``ClassName(a=1, b=2)``, equality between instances
of the same class over the compared fields, the same hash (``frozen`` and ``eq``:
the hash of the tuple of compared fields; ``eq`` without ``frozen``: unhashable;
``eq=False``: identity), :func:`replace`, :func:`fields`, :func:`asdict`, and
``slots=True``.  A method the class body defines itself is kept.  Assigning to a
frozen record raises :class:`~affinity.errors.FrozenInstanceError` (an
``AttributeError``, as dataclasses' is).  No inheritance between records: none
is needed, and refusing it keeps the field table one class's own.
"""

from __future__ import annotations

from operator import attrgetter

from .errors import FrozenInstanceError
from typing import Any, Callable


__all__ = ["asdict", "field", "fields", "record", "replace"]

_FIELDS = "__record_fields__"
_MISSING: Any = type("MISSING", (), {"__repr__": lambda self: "MISSING"})()
#: the default of a parameter whose field has a default_factory (called when it is left out)
_FACTORY: Any = type("FACTORY", (), {"__repr__": lambda self: "<factory>"})()


class Field:
    """One field of a record: its name, its default (a value or a factory), and
    whether ``__init__`` takes it, ``repr`` shows it and ``==``/``hash`` compare it."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "compare")

    def __init__(self, default: Any = _MISSING, default_factory: Any = _MISSING, init: bool = True,
                 repr: bool = True, compare: bool = True) -> None:  # noqa: A002 (dataclasses' words)
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("field(): cannot specify both default and default_factory")
        self.name = ""
        self.type: Any = None  # the annotation, as written
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, init={self.init}, compare={self.compare})"


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | Any = _MISSING,
          init: bool = True, repr: bool = True, compare: bool = True) -> Any:  # noqa: A002
    """A field with a default, a ``default_factory``, or left out of ``__init__``,
    ``repr`` or comparison (:func:`dataclasses.field`'s arguments of the same names)."""
    return Field(default, default_factory, init, repr, compare)


def record(cls: type | None = None, /, *, frozen: bool = True, eq: bool = True,
           slots: bool = False) -> Any:
    """Make ``cls`` a record of the fields its annotations name (``ClassVar`` ones
    excepted), as ``@dataclass(frozen=frozen, eq=eq, slots=slots)`` would.

    Frozen by default: most of affinity's values are.  Usable bare (``@record``)
    or with arguments (``@record(slots=True)``).

    Raises
    ------
    TypeError
        ``cls`` derives from another record, or a field without a default follows
        one with a default.
    ValueError
        A field's default is a ``list``, ``dict`` or ``set`` (shared by every
        instance: use ``default_factory``).
    """
    def wrap(c: type) -> type:
        return _build(c, frozen, eq, slots)

    return wrap if cls is None else wrap(cls)


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record or record class, in declaration order."""
    try:
        return getattr(obj, _FIELDS)
    except AttributeError:
        raise TypeError(f"fields(): {obj!r} is not a record") from None


def replace(obj: Any, /, **changes: Any) -> Any:
    """A copy of the record ``obj`` with ``changes`` (field name -> new value)."""
    for f in fields(obj):
        if not f.init:
            if f.name in changes:
                raise ValueError(f"replace(): field {f.name!r} is not taken by __init__ and cannot be replaced")
        elif f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


def asdict(obj: Any) -> dict[str, Any]:
    """The record ``obj`` as a dict, records, lists, tuples and dicts inside it
    converted too (:func:`dataclasses.asdict`)."""
    if not hasattr(type(obj), _FIELDS):
        raise TypeError(f"asdict(): {obj!r} is not a record")
    return _plain(obj)


def _plain(value: Any) -> Any:
    if hasattr(type(value), _FIELDS):
        return {f.name: _plain(getattr(value, f.name)) for f in getattr(value, _FIELDS)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*[_plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_plain(k), _plain(v)) for k, v in value.items())
    return value


# ------------------------------------------------------------------ building a class

def _build(cls: type, frozen: bool, eq: bool, slots: bool) -> type:
    if any(hasattr(base, _FIELDS) for base in cls.__mro__[1:]):
        raise TypeError(f"record {cls.__qualname__}: a record cannot derive from another record")
    table = _field_table(cls)
    if slots:
        cls = _with_slots(cls, table)
    own = cls.__dict__
    setattr(cls, _FIELDS, table)
    cls.__match_args__ = tuple(f.name for f in table if f.init)  # type: ignore[attr-defined]
    if "__init__" not in own:
        cls.__init__ = _InitOnFirstUse(cls)  # type: ignore[misc]
    if "__repr__" not in own:
        cls.__repr__ = _repr  # type: ignore[assignment]
    compared = tuple(f.name for f in table if f.compare)
    cls.__record_key__ = staticmethod(_key_function(compared))  # type: ignore[attr-defined]
    if eq and "__eq__" not in own:
        cls.__eq__ = _eq  # type: ignore[assignment]
    # dataclasses' rule: a __hash__ the body wrote is kept (Python's implicit None
    # next to a written __eq__ is not one); else frozen+eq hash the fields, eq alone
    # is unhashable, eq=False keeps identity
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    if eq and not explicit_hash:
        cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
    if frozen:
        cls.__setattr__ = _frozen_setattr  # type: ignore[assignment]
        cls.__delattr__ = _frozen_delattr  # type: ignore[assignment]
        if slots:
            cls.__getstate__ = _getstate  # type: ignore[attr-defined]
            cls.__setstate__ = _setstate  # type: ignore[attr-defined]
    return cls


def _field_table(cls: type) -> tuple[Field, ...]:
    """The fields, from the class's own annotations (strings or types), with the
    class attributes set as dataclasses sets them (the default, or nothing)."""
    table = []
    seen_default = False
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        if text.startswith(("ClassVar", "typing.ClassVar", "t.ClassVar")):
            continue
        value = cls.__dict__.get(name, _MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name, f.type = name, annotation
        if isinstance(f.default, (list, dict, set)):
            raise ValueError(f"record {cls.__qualname__}: mutable default {type(f.default).__name__} "
                             f"for field {name!r} is not allowed: use default_factory")
        has_default = f.default is not _MISSING or f.default_factory is not _MISSING
        if f.init and seen_default and not has_default:
            raise TypeError(f"record {cls.__qualname__}: non-default argument {name!r} follows default argument")
        seen_default = seen_default or (f.init and has_default)
        if f.default is not _MISSING:
            setattr(cls, name, f.default)
        elif isinstance(value, Field):
            delattr(cls, name)
        table.append(f)
    return tuple(table)


def _with_slots(cls: type, table: tuple[Field, ...]) -> type:
    """The class again, with ``__slots__`` for its fields (the defaults live in
    ``__init__``, not as class attributes, which slots would shadow)."""
    names = tuple(f.name for f in table)
    body = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    body["__slots__"] = names
    new = type(cls)(cls.__name__, cls.__bases__, body)
    new.__qualname__ = cls.__qualname__
    return new


#: instances a record makes with the generic ``__init__`` before its own is compiled
COMPILE_AFTER = 64


class _InitOnFirstUse:
    """A record's ``__init__`` until it is worth compiling.

    The first :data:`COMPILE_AFTER` instances are made by :func:`_generic_init`
    (no compilation: the first ``compile()`` of a process alone costs 0.8 ms, and
    a launch makes a few instances each of 26 classes); then, or as soon as
    something looks ``__init__`` up on the class (:func:`inspect.signature`,
    ``help()``), the real one is compiled and put on the class in this one's place.
    """

    __slots__ = ("cls", "made")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.made = 0

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is not None and self.made < COMPILE_AFTER:
            self.made += 1
            return _generic_init.__get__(obj, owner)
        init = _compile_init(self.cls)
        type.__setattr__(self.cls, "__init__", init)
        return init if obj is None else init.__get__(obj, owner)


def _generic_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """What the compiled ``__init__`` does, for any record: the arguments bound to
    the fields as Python binds them to its parameters (the same ``TypeError`` for a
    missing, unexpected, doubled or extra argument), then defaults, factories and
    ``__post_init__``."""
    cls = type(self)
    table = getattr(cls, _FIELDS)
    taken = [f.name for f in table if f.init]
    where = f"{cls.__qualname__}.__init__()"
    if len(args) > len(taken):
        raise TypeError(f"{where} takes {_how_many(table)} but {len(args) + 1} "
                        f"{'was' if len(args) == 0 else 'were'} given")
    given = dict(zip(taken, args))
    for name, value in kwargs.items():
        if name not in taken:
            raise TypeError(f"{where} got an unexpected keyword argument {name!r}")
        if name in given:
            raise TypeError(f"{where} got multiple values for argument {name!r}")
        given[name] = value
    missing = [f.name for f in table if f.init and f.name not in given
               and f.default is _MISSING and f.default_factory is _MISSING]
    if missing:
        shown = [repr(n) for n in missing]
        names = shown[0] if len(shown) == 1 else (" and ".join(shown) if len(shown) == 2 else
                                                  ", ".join(shown[:-1]) + ", and " + shown[-1])
        raise TypeError(f"{where} missing {len(missing)} required positional argument"
                        f"{'s' if len(missing) > 1 else ''}: {names}")
    put = object.__setattr__ if cls.__setattr__ is _frozen_setattr else setattr
    for f in table:
        if f.init and f.name in given:
            put(self, f.name, given[f.name])
        elif f.default_factory is not _MISSING:
            put(self, f.name, f.default_factory())
        elif f.default is not _MISSING:
            put(self, f.name, f.default)
    if hasattr(cls, "__post_init__"):
        self.__post_init__()


def _how_many(table: tuple[Field, ...]) -> str:
    """"3 positional arguments", "from 2 to 4 positional arguments": how Python
    words the positional parameters of ``__init__`` (``self`` counted)."""
    taken = [f for f in table if f.init]
    least = 1 + sum(1 for f in taken if f.default is _MISSING and f.default_factory is _MISSING)
    most = 1 + len(taken)
    count = str(most) if least == most else f"from {least} to {most}"
    return f"{count} positional argument{'' if most == 1 and least == most else 's'}"


def _compile_init(cls: type) -> Callable[..., None]:
    """``__init__`` for the fields of ``cls``: what dataclasses would write."""
    frozen = cls.__setattr__ is _frozen_setattr
    params, body, names = ["self"], [], {"_set": object.__setattr__, "_FACTORY": _FACTORY}
    for f in getattr(cls, _FIELDS):
        value = f.name
        if f.default_factory is not _MISSING:
            names[f"_factory_{f.name}"] = f.default_factory
            value = f"_factory_{f.name}()" if not f.init else f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}"
            default = "_FACTORY"
        elif f.default is not _MISSING:
            names[f"_default_{f.name}"] = f.default
            default = f"_default_{f.name}"
            value = f.name if f.init else default
        else:
            default = None
            if not f.init:
                continue
        if f.init:
            params.append(f.name if default is None else f"{f.name}={default}")
        body.append(f"_set(self, {f.name!r}, {value})" if frozen else f"self.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    text = f"def __init__({', '.join(params)}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    exec(compile(text, f"<record {cls.__qualname__}.__init__>", "exec"), names)  # noqa: S102 (our own text)
    init = names["__init__"]
    init.__annotations__ = {f.name: f.type for f in getattr(cls, _FIELDS) if f.init} | {"return": None}
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


def _key_function(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of the compared fields of an instance, as dataclasses' ``__eq__``
    and ``__hash__`` build it."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return attrgetter(*names)


# ------------------------------------------------------------------ the methods every record shares

def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in getattr(self, _FIELDS) if f.repr)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self.__record_key__
    return key(self) == key(other)


def _hash(self: Any) -> int:
    return hash(self.__record_key__(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in getattr(self, _FIELDS))


def _setstate(self: Any, state: tuple[Any, ...]) -> None:
    for f, value in zip(getattr(self, _FIELDS), state):
        object.__setattr__(self, f.name, value)
