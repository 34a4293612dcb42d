"""Pictures of a machine with each thread's number on the PUs it is bound to.

The drawing follows the look of ``lstopo`` and of the figures in Intel's
``KMP_AFFINITY`` documentation: packages are boxes, NUMA nodes sit inside them
(or around several packages when one node spans them), cores are boxes inside
those and each PU (hardware thread) is a small box labelled ``P#<os_index>``.
Given the per-thread OS-proc sets of a plan, every PU shows the numbers of the
threads that may run on it, so *compact*, *scatter* and permuted placements can
be told apart at a glance:

* a thread bound to one PU alone is drawn in its solid colour;
* a thread whose set spans several PUs (``granularity=core`` and coarser) is
  written on each PU of its set in a pale tint with a dashed outline: it floats
  over them;
* PUs this process may not use (outside ``Topology.allowed``) are greyed out
  with a dashed border.

The work is done once, by :func:`layout`, as plain frozen data (:class:`Layout`,
:class:`Box`, :class:`PUBox`, ...); :func:`render_svg` and :func:`render_png`
are two small back-ends that draw that data.  Everything here is pure: no
system calls, no global state, same inputs -> identical bytes.  Pillow is
imported only by :func:`render_png` (install the ``picture`` extra).

Example::

    from affinity.machine.topology import Topology
    from affinity.tools import picture

    topo = Topology.from_synthetic("pack:2 [numa] core:4 pu:2")
    scatter = [{0}, {8}, {2}, {10}, {4}, {12}, {6}, {14}]
    picture.save("scatter.svg", topo, scatter, title="scatter, 8 threads")
"""

from __future__ import annotations

import functools
import importlib
import io
import math
import operator
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..cpulist import format_list, runs
from ..errors import PictureError, PictureUnavailableError
from ..machine.topology import Core, Gpu, NumaNode, Topology
from ..record import record

__all__ = [
    "Box",
    "Fill",
    "Label",
    "Layout",
    "PUBox",
    "ROLES",
    "Rect",
    "layout",
    "png_font",
    "render_png",
    "render_svg",
    "save",
]


#: role -> (label prefix, colour).  Threads of a role are numbered from 0 in
#: the order they appear in ``cpusets`` ("i0" is the first tf-intra thread).
ROLES: Mapping[str, tuple[str, str]] = {
    "tf-intra": ("i", "#6baed6"),
    "tf-inter": ("e", "#fd8d3c"),
    "tf-other": ("f", "#e79ac4"),
    "openmp": ("o", "#74c476"),
    "blas": ("b", "#9e9ac8"),
    "main": ("m", "#b4a7e0"),
    "other": ("x", "#e7c25a"),
    "dataloader": ("w", "#d9a679"),
}
#: role -> what its threads are, for the legend ("other" alone says nothing)
ROLE_WORDS: Mapping[str, str] = {
    "tf-intra": "intra-op pool (TensorFlow's, PyTorch's)",
    "tf-inter": "inter-op pool (TensorFlow's, PyTorch's)",
    "tf-other": "TensorFlow's other threads",
    "openmp": "an OpenMP team",
    "blas": "a BLAS pool",
    "main": "the process's first thread",
    "other": "threads of no pool affinity knows",
    "dataloader": "DataLoader worker processes, one intra-op thread each",
}

# Thread colours (by thread number, repeating): medium tones on which black
# text stays readable, neighbours chosen far apart in hue.
_PALETTE = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854",
            "#ffd92f", "#e5c494", "#7fc8f8", "#c49cde", "#f4a582")

_FONT_FAMILY = "DejaVu Sans Mono, Menlo, Consolas, Liberation Mono, monospace"
_CHAR_EM = 0.62          # advance of a monospace glyph, in em (DejaVu: 0.602), rounded up
_MAX_CONTENT_W = 1800    # automatic wrapping keeps the machine box about this wide
_STRIPES_MAX = 4         # more threads than this on one PU: one neutral fill
_THREAD_CHARS_MAX = 9    # longest thread label kept whole on a PU; longer ones are abbreviated

# Colours of the boxes.
_INK = "#1a1a1a"
_MUTED = "#5c5c5c"
_BG = "#ffffff"
_MACHINE = ("#ffffff", "#333333")
_PACKAGE = ("#e8e8e8", "#555555")
_NUMA = ("#f5e6d3", "#a5825c")
_MEMORY = ("#f5e6d3", "#a5825c")
_GPU = ("#dff0d8", "#3c763d")
_CORE = ("#cfcfcf", "#6e6e6e")
_PU = ("#ffffff", "#6e6e6e")
_PU_OFF = ("#767676", "#262626")   # not allowed to this process (white text on it: 4.5:1)
_MANY = "#d5dbe5"                  # more than _STRIPES_MAX threads on one PU


# ---------------------------------------------------------------------------
# The layout as plain data
# ---------------------------------------------------------------------------

@record(slots=True)
class Rect:
    """An axis-aligned rectangle in pixels (SVG user units).

    Parameters
    ----------
    x, y : int
        The top-left corner.
    w, h : int
        Width and height.
    """

    x: int
    y: int
    w: int
    h: int

    @property
    def right(self) -> int:
        """``x + w``: the x of the right edge."""
        return self.x + self.w

    @property
    def bottom(self) -> int:
        """``y + h``: the y of the bottom edge."""
        return self.y + self.h

    def contains(self, other: Rect) -> bool:
        """Whether ``other`` lies inside this rectangle.

        Parameters
        ----------
        other : Rect
            The rectangle to test.

        Returns
        -------
        bool
            True when ``other`` is inside (edges may touch).
        """
        return (self.x <= other.x and self.y <= other.y
                and other.right <= self.right and other.bottom <= self.bottom)

    def overlaps(self, other: Rect) -> bool:
        """Whether the interiors of this rectangle and ``other`` (a :class:`Rect`) intersect.

        Sharing an edge is not overlapping.

        Returns
        -------
        bool
        """
        return (self.x < other.right and other.x < self.right
                and self.y < other.bottom and other.y < self.bottom)


@record(slots=True)
class Label:
    """One line of text.

    Parameters
    ----------
    x, y : int
        The baseline point: its left end (``anchor="start"``) or its middle
        (``anchor="middle"``).
    text : str
        The text.
    size : int
        Font size in pixels.
    color : str
        Text colour (``#rrggbb``).
    anchor : str
        ``"middle"`` or ``"start"``.
    bold : bool
        Bold text.
    kind : str
        What the text is: ``"title"``, ``"name"``, ``"pu"`` (a PU's P#),
        ``"threads"``, ``"legend"``.
    """

    x: int
    y: int
    text: str
    size: int
    color: str = _INK
    anchor: str = "middle"
    bold: bool = False
    kind: str = ""

    @property
    def extent(self) -> Rect:
        """The box the text is expected to occupy (monospace estimate used by the layout)."""
        w = _text_w(self.text, self.size)
        x = self.x - w // 2 if self.anchor == "middle" else self.x
        asc = math.ceil(self.size * 0.76)
        return Rect(x, self.y - asc, w, asc + math.ceil(self.size * 0.24))


@record(slots=True)
class Fill:
    """A filled rectangle drawn over a box (a thread's colour on a PU, a legend swatch).

    Parameters
    ----------
    rect : Rect
        Where it is drawn.
    fill : str
        Fill colour (``#rrggbb``).
    stroke : str or None
        Outline colour; ``None`` for no outline.
    dashed : bool
        The outline is dashed.
    """

    rect: Rect
    fill: str
    stroke: str | None = None
    dashed: bool = False


@record(slots=True)
class Box:
    """A drawn object and everything inside it, in painting order.

    Parameters
    ----------
    kind : str
        ``"machine"``, ``"numa"``, ``"memory"`` (a NUMA node without PUs),
        ``"package"``, ``"core"``, ``"pu"``, ``"gpu"``, ``"legend"`` or ``"legend-item"``.
    key : str
        Unique in the layout: ``"package-0"``, ``"core-5"``, ``"gpu-3"`` by logical index;
        ``"pu-17"`` by OS index; ``"numa-1"``, or ``"numa-1.0"``, ``"numa-1.1"``
        for the parts of a node split across packages.
    rect : Rect
        Where the box is drawn.
    fill, stroke : str
        Fill and outline colours (``#rrggbb``).
    dashed : bool
        The outline is dashed.
    labels : tuple of Label
        Its text.
    fills : tuple of Fill
        Rectangles drawn over it (thread colours, legend swatches).
    tooltip : str
        The text shown on hovering (``<title>`` in SVG).
    attrs : tuple of (str, str)
        Extra facts, written as ``data-*`` in SVG.
    children : tuple of Box
        The boxes inside it.
    """

    kind: str
    key: str
    rect: Rect
    fill: str
    stroke: str
    dashed: bool = False
    labels: tuple[Label, ...] = ()
    fills: tuple[Fill, ...] = ()
    tooltip: str = ""
    attrs: tuple[tuple[str, str], ...] = ()
    children: tuple[Box, ...] = ()

    def walk(self) -> Iterator[Box]:
        """This box, then its descendants, depth first (painting order).

        Returns
        -------
        iterator of Box
            The boxes of this tree.
        """
        yield self
        for c in self.children:
            yield from c.walk()


@record(slots=True)
class PUBox:
    """Where one PU is drawn and which threads are written on it.

    Parameters
    ----------
    os_index, logical_index : int
        The PU's OS index (``P#``) and logical index (``L#``).
    core : int
        Logical index of its core.
    package : int
        Logical index of its package.
    rect : Rect
        Where the PU is drawn.
    allowed : bool
        This process may use the PU.
    threads : tuple of int
        Numbers of the threads whose set contains this PU, ascending.
    names : tuple of str
        How each of those threads is named (``"3"``, or ``"i3"`` with roles).
    floating : tuple of bool
        Per thread: its set spans more than this PU.
    text : str
        The thread text drawn on the PU (abbreviated when long).
    """

    os_index: int
    logical_index: int
    core: int
    package: int
    rect: Rect
    allowed: bool
    threads: tuple[int, ...]
    names: tuple[str, ...]
    floating: tuple[bool, ...]
    text: str


@record(slots=True)
class Layout:
    """A whole picture, as :func:`layout` computes it.

    Parameters
    ----------
    width, height : int
        The canvas size in pixels.
    title : str
        The title line.
    description : str
        The picture in words (SVG ``<desc>``).
    labels : tuple of Label
        Free text (the title line).
    machine : Box
        The machine's box tree.
    legend : Box or None
        The legend; ``None`` when there is nothing to explain.
    pus : tuple of PUBox
        For convenience, every PU's :class:`PUBox` in logical order.
    background : str
        The canvas colour.
    """

    width: int
    height: int
    title: str
    description: str
    labels: tuple[Label, ...]
    machine: Box
    legend: Box | None
    pus: tuple[PUBox, ...]
    background: str = _BG

    def boxes(self) -> Iterator[Box]:
        """Every box, in painting order (machine tree, then legend).

        Returns
        -------
        iterator of Box
            The boxes.
        """
        yield from self.machine.walk()
        if self.legend is not None:
            yield from self.legend.walk()

    def pu(self, os_index: int) -> PUBox:
        """The PU with this OS index.

        Parameters
        ----------
        os_index : int
            The PU's OS index (``P#``).

        Returns
        -------
        PUBox
            Where it is drawn and its threads.

        Raises
        ------
        KeyError
            The machine has no such PU.
        """
        for p in self.pus:
            if p.os_index == os_index:
                return p
        raise KeyError(f"no PU P#{os_index} in this layout")


# ---------------------------------------------------------------------------
# Text metrics (monospace estimate, shared by both back-ends)
# ---------------------------------------------------------------------------

def _text_w(text: str, size: int) -> int:
    return math.ceil(len(text) * size * _CHAR_EM)


def _fit(text: str, width: int, size: int) -> str:
    """``text`` cut with an ellipsis so that it is at most ``width`` pixels wide."""
    if _text_w(text, size) <= width:
        return text
    n = max(0, int(width // (size * _CHAR_EM)) - 1)
    return text[:n] + "\u2026" if n else ""


def _compress(nums: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``; runs of two stay ``"0,1"``."""
    out: list[str] = []
    for a, b in runs(nums):
        if b - a >= 2:
            out.append(f"{a}-{b}")
        else:
            out.extend(str(n) for n in range(a, b + 1))
    return ",".join(out)


def _names_text(items: Sequence[tuple[str, int]]) -> str:
    """Thread names grouped by prefix: ``[("i",0),("i",1),("i",2),("e",0)]`` -> ``"i0-2,e0"``."""
    order: list[str] = []
    by: dict[str, list[int]] = {}
    for prefix, n in items:
        if prefix not in by:
            order.append(prefix)
            by[prefix] = []
        by[prefix].append(n)
    parts = []
    for prefix in order:
        for piece in _compress(sorted(by[prefix])).split(","):
            parts.append(prefix + piece)
    return ",".join(parts)


def _abbreviate(items: Sequence[tuple[str, int]], max_chars: int) -> str:
    """The names of ``items`` in at most ``max_chars`` characters: the whole list
    when it fits, else its first names and ``+N`` for the ``N`` left out."""
    return _abbreviated(items, max_chars)[0]


def _abbreviated(items: Sequence[tuple[str, int]], max_chars: int) -> tuple[str, int]:
    """(:func:`_abbreviate`'s text, how many of ``items`` it names)."""
    full = _names_text(items)
    if len(full) <= max_chars:
        return full, len(items)
    for keep in range(len(items) - 1, 0, -1):
        s = f"{_names_text(items[:keep])}+{len(items) - keep}"
        if len(s) <= max_chars:
            return s, keep
    return f"+{len(items)}", 0


def _named(ts: Sequence[_Thread]) -> list[_Thread]:
    """The threads of one PU that its label names (the others are its ``+N``)."""
    return list(ts[:_abbreviated([(t.prefix, t.rank) for t in ts], _THREAD_CHARS_MAX)[1]])


def _tint(color: str, amount: float = 0.6) -> str:
    """``color`` mixed with white (``amount`` of white)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(c + (255 - c) * amount)  # noqa: E731
    return f"#{mix(r):02x}{mix(g):02x}{mix(b):02x}"


def _shade(color: str, amount: float = 0.45) -> str:
    """``color`` darkened (``amount`` of black)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(c * (1 - amount))  # noqa: E731
    return f"#{mix(r):02x}{mix(g):02x}{mix(b):02x}"


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

@record(slots=True)
class _Thread:
    number: int
    cpus: frozenset[int]
    prefix: str     # "" without roles
    rank: int       # number within its role (the thread number without roles)
    color: str

    @property
    def name(self) -> str:
        return f"{self.prefix}{self.rank}"

    @property
    def floating(self) -> bool:
        return len(self.cpus) > 1


def _threads(topo: Topology, cpusets: Any, roles: Any) -> tuple[_Thread, ...]:
    if cpusets is None:
        if roles is not None:
            raise PictureError("roles were given without cpusets")
        return ()
    if isinstance(cpusets, (str, bytes, Mapping)) or not isinstance(cpusets, Iterable):
        raise PictureError(f"cpusets must be a sequence of per-thread OS proc sets, "
                           f"got {type(cpusets).__name__}")
    sets: list[frozenset[int]] = []
    for i, s in enumerate(cpusets):
        if isinstance(s, (str, bytes)) or not isinstance(s, Iterable):
            raise PictureError(f"thread {i}: expected a set of OS proc ids, got {s!r}")
        try:
            cpus = frozenset(operator.index(c) for c in s)
        except (TypeError, ValueError):
            raise PictureError(f"thread {i}: OS proc ids must be integers, got {s!r}") from None
        if not cpus:
            raise PictureError(f"thread {i}: empty OS proc set (a thread must run somewhere)")
        unknown = cpus - topo.cpuset
        if unknown:
            raise PictureError(f"thread {i}: OS proc{'s' if len(unknown) > 1 else ''} "
                               f"{format_list(unknown)} not in this machine ({topo.describe()})")
        sets.append(cpus)
    if roles is None:
        return tuple(_Thread(i, c, "", i, _PALETTE[i % len(_PALETTE)]) for i, c in enumerate(sets))
    if isinstance(roles, (str, bytes, Mapping)) or not isinstance(roles, Iterable):
        raise PictureError(f"roles must be a sequence of role names, got {type(roles).__name__}")
    roles = list(roles)
    if len(roles) != len(sets):
        raise PictureError(f"{len(roles)} roles for {len(sets)} threads: give one role per thread")
    out = []
    seen: dict[str, int] = {}
    for i, (cpus, role) in enumerate(zip(sets, roles)):
        if not isinstance(role, str) or role not in ROLES:
            raise PictureError(f"thread {i}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
        prefix, color = ROLES[role]
        out.append(_Thread(i, cpus, prefix, seen.get(role, 0), color))
        seen[role] = seen.get(role, 0) + 1
    return tuple(out)


# ---------------------------------------------------------------------------
# The layout builder: sizes first (relative coordinates), absolute at the end
# ---------------------------------------------------------------------------

class _Node:
    """A box under construction (private and short-lived; frozen into a :class:`Box`)."""

    __slots__ = ("kind", "key", "w", "h", "fill", "stroke", "dashed", "labels", "fills",
                 "tooltip", "attrs", "children", "pu")

    def __init__(self, kind: str, key: str, w: int, h: int, fill: str, stroke: str, *,
                 dashed: bool = False, tooltip: str = "", attrs: tuple[tuple[str, str], ...] = ()):
        self.kind, self.key, self.w, self.h = kind, key, w, h
        self.fill, self.stroke, self.dashed = fill, stroke, dashed
        self.labels: list[Label] = []   # relative coordinates
        self.fills: list[Fill] = []     # relative coordinates
        self.tooltip, self.attrs = tooltip, attrs
        self.children: list[tuple[int, int, _Node]] = []
        self.pu: dict[str, Any] | None = None

    def freeze(self, x: int, y: int, pus: list[PUBox]) -> Box:
        kids = tuple(c.freeze(x + dx, y + dy, pus) for dx, dy, c in self.children)
        labels = tuple(Label(x=x + lb.x, y=y + lb.y, text=lb.text, size=lb.size, color=lb.color, anchor=lb.anchor,
                             bold=lb.bold, kind=lb.kind)
                       for lb in self.labels)
        fills = tuple(Fill(Rect(x + f.rect.x, y + f.rect.y, f.rect.w, f.rect.h), f.fill, f.stroke, f.dashed)
                      for f in self.fills)
        rect = Rect(x, y, self.w, self.h)
        if self.pu is not None:
            pus.append(PUBox(rect=rect, **self.pu))
        return Box(kind=self.kind, key=self.key, rect=rect, fill=self.fill, stroke=self.stroke, dashed=self.dashed,
                   labels=labels, fills=fills, tooltip=self.tooltip, attrs=self.attrs, children=kids)


def _flow(items: Sequence[tuple[int, int]], max_w: int, gap: int) -> tuple[list[tuple[int, int]], int, int]:
    """Place boxes left to right, starting a new row when ``max_w`` would be passed.
    Returns their offsets and the size of the whole."""
    pos: list[tuple[int, int]] = []
    x = y = row_h = total_w = 0
    for w, h in items:
        if x and x + w > max_w:
            y += row_h + gap
            x = row_h = 0
        pos.append((x, y))
        total_w = max(total_w, x + w)
        row_h = max(row_h, h)
        x += w + gap
    return pos, total_w, (y + row_h if items else 0)


@record(slots=True)
class _Style:
    pad: int
    band: int      # height of the name strip at the top
    size: int      # font size of the name
    bold: bool
    gap: int       # between children


_S_MACHINE = _Style(8, 20, 12, True, 10)
_S_PACKAGE = _Style(7, 18, 11, True, 8)
_S_NUMA = _Style(6, 16, 10, False, 6)
_S_CORE = _Style(4, 14, 9, False, 3)
_PU_NAME = 10     # font size of "P#n"
_PU_THREADS = 11  # font size of the thread names
_PU_H = 34


def _container(kind: str, key: str, style: _Style, colors: tuple[str, str], name: str,
               kids: Sequence[_Node], max_w: int, *, tooltip: str = "",
               attrs: tuple[tuple[str, str], ...] = (), gap: int | None = None) -> _Node:
    pos, cw, ch = _flow([(k.w, k.h) for k in kids], max_w, style.gap if gap is None else gap)
    # wide enough for the name (up to a point: longer names are cut)
    w = max(cw, 40, min(_text_w(name, style.size), 320)) + 2 * style.pad
    h = style.band + ch + style.pad
    node = _Node(kind, key, w, h, *colors, tooltip=tooltip or name, attrs=attrs)
    node.labels.append(Label(x=style.pad, y=style.band - 5, text=_fit(name, w - 2 * style.pad, style.size),
                             size=style.size, color=_INK, anchor="start", bold=style.bold, kind="name"))
    node.children = [(style.pad + x, style.band + y, k) for (x, y), k in zip(pos, kids)]
    return node


def _index_attrs(logical_index: int, os_index: int) -> tuple[tuple[str, str], ...]:
    """The ``data-*`` facts every package, NUMA node and core box carries."""
    return (("data-logical-index", str(logical_index)), ("data-os-index", str(os_index)))


def _numa_tooltip(node: NumaNode) -> str:
    return f"NUMANode P#{node.os_index} L#{node.logical_index}, cpus {format_list(node.cpuset)}"


def _threads_on_pus(threads: Sequence[_Thread]) -> dict[int, list[_Thread]]:
    """OS index -> the threads whose set contains that PU: those bound to it alone
    first, then those floating over it, each in thread order (a label too short for
    all of them names the pinned ones; a live process has many floating threads)."""
    on_pu: dict[int, list[_Thread]] = {}
    for t in threads:
        for c in sorted(t.cpus):
            on_pu.setdefault(c, []).append(t)
    return {c: sorted(ts, key=lambda t: (t.floating, t.number)) for c, ts in on_pu.items()}


def _thread_fills(area: Rect, ts: Sequence[_Thread]) -> list[Fill]:
    """The colours of the threads on one PU: one stripe each across ``area`` (solid
    when bound to the PU alone, a dashed tint when floating), or one neutral fill
    for more than :data:`_STRIPES_MAX` threads."""
    if len(ts) > _STRIPES_MAX:
        return [Fill(area, _MANY, "#6f7f99", False)]
    out = []
    k = len(ts)
    for j, t in enumerate(ts):
        x0 = area.x + round(j * area.w / k)
        x1 = area.x + round((j + 1) * area.w / k)
        if t.floating:
            out.append(Fill(Rect(x0, area.y, x1 - x0, area.h), _tint(t.color), _shade(t.color), True))
        else:
            out.append(Fill(Rect(x0, area.y, x1 - x0, area.h), t.color))
    return out


def _gpu_node(gpu: Gpu, label: str) -> _Node:
    """The small box of a GPU, drawn beside the cores of its NUMA node: its bus id,
    and ``label`` (the ranks bound with it) or its vendor."""
    name = f"GPU {gpu.bus_id.removeprefix('0000:')}"
    second = label or gpu.vendor_name
    w = max(_text_w(name, 10), _text_w(second, 9)) + 12
    node = "no NUMA node given" if gpu.numa_node < 0 else f"NUMANode P#{gpu.numa_node}"
    g = _Node("gpu", f"gpu-{gpu.logical_index}", w, 38, *_GPU,
              tooltip=f"GPU L#{gpu.logical_index} {gpu.describe()} ({node})" + (f"; {label}" if label else ""),
              attrs=(("data-bus-id", gpu.bus_id), ("data-numa-node", str(gpu.numa_node)),
                     ("data-logical-index", str(gpu.logical_index))))
    g.labels.append(Label(x=6, y=15, text=name, size=10, color=_INK, anchor="start", bold=True, kind="name"))
    g.labels.append(Label(x=6, y=30, text=_fit(second, w - 12, 9), size=9, color=_MUTED, anchor="start", bold=False,
                          kind="name"))
    return g


def _memory_node(node: NumaNode) -> _Node:
    """The small box of a NUMA node without PUs (memory only)."""
    label = f"NUMANode P#{node.os_index}"
    w = max(_text_w(label, 10), _text_w("memory only", 9)) + 12
    m = _Node("memory", f"numa-{node.logical_index}", w, 38, *_MEMORY,
              tooltip=f"{label} L#{node.logical_index}, memory only (no PU)",
              attrs=_index_attrs(node.logical_index, node.os_index))
    m.labels.append(Label(x=6, y=15, text=label, size=10, color=_INK, anchor="start", bold=False, kind="name"))
    m.labels.append(Label(x=6, y=30, text="memory only", size=9, color=_MUTED, anchor="start", bold=False,
                          kind="name"))
    return m


@record(slots=True)
class _NumaPlan:
    """Where each NUMA node is drawn."""

    #: package -> its cores grouped by NUMA node (``None``: no node), in core order
    groups: dict[int, list[tuple[int | None, list[Core]]]]
    enclosing: dict[int, tuple[int, ...]]   # node -> the whole packages it covers (drawn around them)
    split: set[int]                          # nodes drawn in parts, one per package
    unowned: list[NumaNode]                  # nodes holding PUs but drawn nowhere: named on a box


def _numa_plan(topology: Topology) -> _NumaPlan:
    """Decide where each NUMA node goes: inside a package, around whole packages,
    in parts (one per package it touches), or only named (an outer node over inner ones)."""
    pkg_cores: dict[int, list[Core]] = {p.logical_index: [] for p in topology.packages}
    for c in topology.cores:
        pkg_cores[c.package].append(c)
    node_of_core = {c.logical_index: topology.pu(min(c.cpuset)).numa for c in topology.cores}
    owners = {n for n in node_of_core.values() if n is not None}
    enclosing: dict[int, tuple[int, ...]] = {}
    split: set[int] = set()
    for li in sorted(owners):
        n = topology.numa_nodes[li]
        pk = tuple(p.logical_index for p in topology.packages if p.cpuset & n.cpuset)
        if len(pk) < 2:
            continue
        whole = frozenset().union(*(topology.packages[p].cpuset for p in pk)) == n.cpuset
        if whole and pk == tuple(range(pk[0], pk[-1] + 1)):
            enclosing[li] = pk
        else:
            split.add(li)
    unowned = [n for n in topology.numa_nodes if n.cpuset and n.logical_index not in owners]
    groups: dict[int, list[tuple[int | None, list[Core]]]] = {}
    for p, cores in pkg_cores.items():
        by_node: dict[int | None, list[Core]] = {}
        for c in cores:
            by_node.setdefault(node_of_core[c.logical_index], []).append(c)
        groups[p] = list(by_node.items())
    return _NumaPlan(groups, enclosing, split, unowned)


class _Builder:
    """The box tree of one machine with its threads (relative coordinates).

    The sizes every PU and core box share, the threads on each PU and where the
    NUMA nodes go are computed once; :meth:`machine` then builds the tree for a
    number of cores per row (a dry run with empty cores helps choose that number).
    """

    def __init__(self, topology: Topology, threads: Sequence[_Thread], unit: str = "thread",
                 gpu_labels: Mapping[str, str] | None = None):
        self.topo = topology
        self.gpu_labels = dict(gpu_labels or {})
        self.gpus_drawn: set[int] = set()
        self.words = _UNITS[unit]
        self.on_pu = _threads_on_pus(threads)
        # -- PU size: wide enough for "P#<largest>" and the longest thread text (capped)
        max_os = max(p.os_index for p in topology.pus)
        self.texts = {o: _abbreviate([(t.prefix, t.rank) for t in ts], _THREAD_CHARS_MAX)
                      for o, ts in self.on_pu.items()}
        longest = max((len(s) for s in self.texts.values()), default=1)
        self.pu_w = max(34, _text_w(f"P#{max_os}", _PU_NAME) + 8, _text_w("0" * longest, _PU_THREADS) + 16)
        self.numa_by_index = {n.logical_index: n for n in topology.numa_nodes}
        # -- cores: PUs in a row (up to 3) or a near-square grid; every core the same size
        per_core = max(len(c.cpuset) for c in topology.cores)
        self.pu_cols = per_core if per_core <= 3 else math.ceil(math.sqrt(per_core))
        pu_rows = math.ceil(per_core / self.pu_cols)
        grid_w = self.pu_cols * self.pu_w + (self.pu_cols - 1) * _S_CORE.gap
        grid_h = pu_rows * _PU_H + (pu_rows - 1) * _S_CORE.gap
        longest_core = max(len(f"Core P#{c.os_index}") for c in topology.cores)
        self.core_w = max(grid_w, _text_w("x" * longest_core, _S_CORE.size)) + 2 * _S_CORE.pad
        self.core_h = _S_CORE.band + grid_h + _S_CORE.pad
        self.core_gap = _S_CORE.gap + 3
        self.numa = _numa_plan(topology)
        self.biggest = max((len(cs) for gs in self.numa.groups.values() for _, cs in gs), default=1)

    def _pu_tooltip(self, os_index: int, ok: bool, ts: Sequence[_Thread]) -> str:
        topo = self.topo
        pu = topo.pu(os_index)
        tip = [f"PU P#{os_index} L#{pu.logical_index}, core P#{topo.cores[pu.core].os_index} "
               f"L#{pu.core}, package P#{topo.packages[pu.package].os_index}"]
        if pu.numa is not None:
            tip.append(f", NUMANode P#{self.numa_by_index[pu.numa].os_index}")
        if not ok:
            tip.append("; not allowed to this process")
        if ts:
            tip.append(f"; {self.words['many']} " + ", ".join(
                f"{t.name}" + (f" ({self.words['over']} {format_list(t.cpus)})" if t.floating else " (alone)")
                for t in ts))
        else:
            tip.append(f"; no {self.words['one']}")
        return "".join(tip)

    def pu_node(self, os_index: int) -> _Node:
        """The box of one PU: its ``P#`` and the threads that may run on it."""
        pu = self.topo.pu(os_index)
        ok = os_index in self.topo.allowed
        ts = self.on_pu.get(os_index, [])
        fill, stroke = _PU if ok else _PU_OFF
        w = self.pu_w
        attrs = (("data-allowed", "true" if ok else "false"),
                 ("data-logical-index", str(pu.logical_index)),
                 ("data-os-index", str(os_index)),
                 ("data-thread-names", ",".join(t.name for t in ts)),
                 ("data-threads", ",".join(str(t.number) for t in ts)))
        node = _Node("pu", f"pu-{os_index}", w, _PU_H, fill, stroke, dashed=not ok,
                     tooltip=self._pu_tooltip(os_index, ok, ts), attrs=attrs)
        node.labels.append(Label(x=w // 2, y=12, text=f"P#{os_index}", size=_PU_NAME, color=_INK if ok else "#ffffff",
                                 anchor="middle", bold=False, kind="pu"))
        area = Rect(2, 15, w - 4, _PU_H - 17)
        if ts:
            node.fills.extend(_thread_fills(area, ts))
            node.labels.append(Label(x=w // 2, y=area.y + area.h // 2 + 4, text=self.texts[os_index],
                                     size=_PU_THREADS, color=_INK, anchor="middle", bold=True, kind="threads"))
        node.pu = dict(os_index=os_index, logical_index=pu.logical_index, core=pu.core,
                       package=pu.package, allowed=ok, threads=tuple(t.number for t in ts),
                       names=tuple(t.name for t in ts), floating=tuple(t.floating for t in ts),
                       text=self.texts.get(os_index, ""))
        return node

    def core_node(self, core: Core) -> _Node:
        """The box of one core with its PUs (by thread rank) in a grid."""
        order = sorted(core.cpuset, key=lambda o: self.topo.pu(o).thread)
        name = f"Core P#{core.os_index}"
        extra = f" [{core.kind}]" if core.kind else ""
        node = _Node("core", f"core-{core.logical_index}", self.core_w, self.core_h, *_CORE,
                     tooltip=f"{name} L#{core.logical_index}{extra}, cpus {format_list(core.cpuset)}",
                     attrs=_index_attrs(core.logical_index, core.os_index))
        node.labels.append(Label(x=_S_CORE.pad, y=_S_CORE.band - 4,
                                 text=_fit(name, self.core_w - 2 * _S_CORE.pad, _S_CORE.size), size=_S_CORE.size,
                                 color=_INK, anchor="start", bold=False, kind="name"))
        for j, o in enumerate(order):
            r, c = divmod(j, self.pu_cols)
            node.children.append((_S_CORE.pad + c * (self.pu_w + _S_CORE.gap),
                                  _S_CORE.band + r * (_PU_H + _S_CORE.gap), self.pu_node(o)))
        return node

    def empty_core(self, core: Core) -> _Node:
        """A core box of the right size with nothing in it (for dry runs)."""
        return _Node("core", "", self.core_w, self.core_h, "", "")

    def gpu_nodes(self, node: NumaNode | None) -> list[_Node]:
        """The boxes of the GPUs on ``node`` not drawn yet (``None``: every GPU not
        drawn yet, for the machine's own row)."""
        out = []
        for g in self.topo.gpus:
            if g.logical_index in self.gpus_drawn or (node is not None and g.numa_node != node.os_index):
                continue
            self.gpus_drawn.add(g.logical_index)
            out.append(_gpu_node(g, self.gpu_labels.get(g.bus_id, "")))
        return out

    def _numa_in_package(self, n: int, cnodes: list[_Node], row_w: int, parts: dict[int, int]) -> _Node:
        """The box of NUMA node ``n`` (or of its next part, if split) inside a package,
        its GPUs after its cores."""
        node = self.topo.numa_nodes[n]
        cnodes = cnodes + self.gpu_nodes(node)
        if n in self.numa.split:
            part = parts.get(n, 0)
            parts[n] = part + 1
            key, label = f"numa-{n}.{part}", f"NUMANode P#{node.os_index} (part)"
        else:
            key, label = f"numa-{n}", f"NUMANode P#{node.os_index}"
        return _container("numa", key, _S_NUMA, _NUMA, label, cnodes, row_w, tooltip=_numa_tooltip(node),
                          attrs=_index_attrs(n, node.os_index), gap=self.core_gap)

    def _package(self, p: int, make_core: Any, row_w: int, parts: dict[int, int]) -> _Node:
        """The box of package ``p``: its NUMA nodes, or its cores directly."""
        pkg = self.topo.packages[p]
        kids: list[_Node] = []
        for n, cores in self.numa.groups[p]:
            cnodes = [make_core(c) for c in cores]
            if n is None or n in self.numa.enclosing:
                kids.extend(cnodes)
            else:
                kids.append(self._numa_in_package(n, cnodes, row_w, parts))
        name = f"Package P#{pkg.os_index}"
        inner = [n for n in self.numa.unowned if n.cpuset <= pkg.cpuset]
        if inner:
            name += "  " + ", ".join(f"NUMANode P#{n.os_index}" for n in inner)
        # cores directly in the package wrap at the width of a row of cores (and
        # NUMA boxes beside them go below); NUMA boxes alone sit side by side
        # while the package stays within the width budget
        budget = max(row_w, _MAX_CONTENT_W - 2 * (_S_MACHINE.pad + _S_PACKAGE.pad))
        gap = None
        if any(k.kind == "core" for k in kids):
            budget, gap = row_w, self.core_gap
        return _container("package", f"package-{p}", _S_PACKAGE, _PACKAGE, name, kids, budget, gap=gap,
                          tooltip=f"Package P#{pkg.os_index} L#{p}, cpus {format_list(pkg.cpuset)}",
                          attrs=_index_attrs(p, pkg.os_index))

    def _top_level(self, make_core: Any, row_w: int) -> list[_Node]:
        """The boxes directly in the machine: packages (or NUMA nodes around whole
        packages) in package order, then the memory-only NUMA nodes."""
        parts: dict[int, int] = {}  # split node -> parts drawn so far
        top: list[_Node] = []
        done: set[int] = set()
        for pkg in self.topo.packages:
            p = pkg.logical_index
            if p in done:
                continue
            n = next((li for li, pk in self.numa.enclosing.items() if p in pk), None)
            if n is None:
                top.append(self._package(p, make_core, row_w, parts))
                done.add(p)
                continue
            pk = self.numa.enclosing[n]
            done.update(pk)
            node = self.topo.numa_nodes[n]
            pnodes = [self._package(q, make_core, row_w, parts) for q in pk] + self.gpu_nodes(node)
            top.append(_container(
                "numa", f"numa-{n}", _S_NUMA, _NUMA, f"NUMANode P#{node.os_index}", pnodes,
                _MAX_CONTENT_W - 2 * _S_NUMA.pad,
                tooltip=f"{_numa_tooltip(node)} (spans {len(pk)} packages)",
                attrs=_index_attrs(n, node.os_index)))
        for node in self.topo.numa_nodes:
            if not node.cpuset:
                top.append(_memory_node(node))
            top.extend(self.gpu_nodes(node) if not node.cpuset else [])
        top.extend(self.gpu_nodes(None))  # GPUs of no node drawn (numa_node -1, a node without box)
        return top

    def machine(self, cols: int, make_core: Any = None) -> _Node:
        """The machine's box tree with ``cols`` cores per row; ``make_core`` draws a
        core (default :meth:`core_node`)."""
        row_w = cols * self.core_w + (cols - 1) * self.core_gap
        self.gpus_drawn = set()
        top = self._top_level(make_core or self.core_node, row_w)
        topo = self.topo
        machine_name = "Machine" + (f" ({topo.source})" if topo.source else "")
        spread = [n for n in self.numa.unowned if not any(n.cpuset <= p.cpuset for p in topo.packages)]
        if spread:
            machine_name += "  " + ", ".join(f"NUMANode P#{n.os_index}" for n in spread)
        return _container("machine", "machine", _S_MACHINE, _MACHINE, machine_name, top,
                          max(_MAX_CONTENT_W, max(k.w for k in top)),
                          tooltip=f"Machine: {topo.describe()}")

    def columns(self, max_columns: int | None) -> int:
        """How many cores go in a row: ``max_columns`` when given, else chosen."""
        if max_columns is not None:
            return max_columns
        if self.biggest <= 8:
            return self.biggest  # small machines: a package's cores in one row, as in Intel's figures

        # try each width on a dry run with empty cores; keep the one whose machine box
        # is closest to 16:10 within the width budget, preferring full rows
        def score(c: int) -> tuple[bool, float]:
            m = self.machine(c, self.empty_core)
            ragged = 0.15 if self.biggest % c else 0.0
            return (m.w > _MAX_CONTENT_W + 40, abs(math.log(m.w / m.h / 1.6)) + ragged)
        return min(range(2, self.biggest + 1), key=score)


def _canvas(topology: Topology, threads: Sequence[_Thread], on_pu: Mapping[int, Sequence[_Thread]],
            machine: _Node, title: str | None, unit: str = "thread") -> Layout:
    """Place the title, the machine and the legend on the canvas (absolute coordinates)."""
    margin = 10
    legend_nodes = _legend(topology, threads, on_pu, unit)
    canvas_w = max([machine.w, 360] + [k.w + 12 for k in legend_nodes]) + 2 * margin
    legend = None
    if legend_nodes:
        legend = _container("legend", "legend", _Style(6, 18, 10, True, 10), ("#fafafa", "#bbbbbb"),
                            "Legend", legend_nodes, canvas_w - 2 * margin - 12)
        legend.w = canvas_w - 2 * margin
    head = title if title is not None else (
        f"{len(threads)} {_UNITS[unit]['one' if len(threads) == 1 else 'many']} on {topology.describe()}"
        if threads else topology.describe())
    heads = _wrapped(head, canvas_w - 2 * margin, 14)
    y_machine = margin + 26 + 18 * (len(heads) - 1)
    pus: list[PUBox] = []
    machine_box = machine.freeze(margin, y_machine, pus)
    y = machine_box.rect.bottom + 12
    legend_box = legend.freeze(margin, y, []) if legend is not None else None
    height = (legend_box.rect.bottom if legend_box else machine_box.rect.bottom) + margin
    titles = tuple(Label(x=margin, y=margin + 16 + 18 * i, text=line, size=14, color=_INK, anchor="start", bold=True,
                         kind="title")
                   for i, line in enumerate(heads))
    pus.sort(key=lambda b: b.logical_index)
    return Layout(width=canvas_w, height=height, title=head, description=_description(topology, threads, head, unit),
                  labels=titles, machine=machine_box, legend=legend_box, pus=tuple(pus))


def _wrapped(text: str, width: int, size: int, lines: int = 3) -> list[str]:
    """``text`` in lines at most ``width`` pixels wide, broken between words (a long
    title of ranks or a job read whole, not cut); past ``lines`` lines the last is cut
    with an ellipsis."""
    import textwrap  # lazy: only for a title longer than the picture is wide

    chars = max(8, int(width // (size * _CHAR_EM)))
    out = textwrap.wrap(text, chars, break_on_hyphens=False) or [""]
    if len(out) > lines:
        out = out[:lines - 1] + [_fit(" ".join(out[lines - 1:]), width, size)]
    return [_fit(line, width, size) for line in out]


def layout(topology: Topology, cpusets: Sequence[Iterable[int]] | None = None, *,
           title: str | None = None, roles: Sequence[str] | None = None,
           max_columns: int | None = None, unit: str = "thread",
           gpu_labels: Mapping[str, str] | None = None) -> Layout:
    """Compute the picture of ``topology`` with ``cpusets`` as plain data.

    :func:`render_svg` and :func:`render_png` draw it.

    Parameters
    ----------
    topology : Topology
        The machine to draw.
    cpusets : sequence of iterable of int, optional
        Thread ``i`` -> its OS proc set; ``None`` draws the machine alone.
    title : str, optional
        The title line (default: the number of threads and the machine's description).
    roles : sequence of str, optional
        One per thread: ``"tf-intra"``, ``"tf-inter"``, ``"tf-other"``, ``"openmp"``,
        ``"main"``, ``"other"``; colours threads by role and names them ``i0``,
        ``e1``, ... (numbered within their role) instead of by thread number.
    max_columns : int, optional
        How many cores go in a row inside a NUMA node or package (default: chosen
        from the machine's size).
    unit : {"thread", "rank"}
        What each set of ``cpusets`` is, for the words of the legend, tooltips and
        description: a thread (default) or a rank's share of the node.
    gpu_labels : mapping, optional
        GPU bus id -> a short text for its box (``"rank 3"``); the topology's GPUs
        are drawn in any case, each in its NUMA node beside the cores (a GPU of no
        known node in the machine's row), labelled with its vendor by default.

    Returns
    -------
    Layout
        The canvas size, title, box tree, legend and every PU's :class:`PUBox`.

    Raises
    ------
    PictureError
        ``topology`` is not a :class:`Topology`, a set names an unknown PU, a set
        is empty, a role is bad, or ``max_columns`` is not a positive integer.
    """
    if not isinstance(topology, Topology):
        raise PictureError(f"expected a Topology, got {type(topology).__name__}")
    if max_columns is not None and (isinstance(max_columns, bool) or not isinstance(max_columns, int)
                                    or max_columns < 1):
        raise PictureError(f"max_columns must be a positive integer, got {max_columns!r}")
    if unit not in _UNITS:
        raise PictureError(f"unit must be one of {', '.join(map(repr, _UNITS))}, got {unit!r}")
    threads = _threads(topology, cpusets, roles)
    builder = _Builder(topology, threads, unit, gpu_labels)
    machine = builder.machine(builder.columns(max_columns))
    return _canvas(topology, threads, builder.on_pu, machine, title, unit)


#: what each drawn set is (``unit=``), in the words of the legend, tooltips and description:
#: a thread of a plan, or a rank's share of a node (``affinity plan --ranks --picture``)
_UNITS = {
    "thread": {"one": "thread", "many": "threads", "numbers": "thread numbers",
               "floating": "set spans several PUs: the thread floats over each of them",
               "over": "floats over", "shared": "several threads may run on this PU"},
    "rank": {"one": "rank", "many": "ranks", "numbers": "rank numbers",
             "floating": "a rank's share spans several PUs: its threads may run on each of them",
             "over": "share", "shared": "several ranks share this PU"},
}

_SW_W, _SW_H = 28, 16  # a legend swatch
_Item = tuple[str, list[tuple[tuple[Fill, ...], str]], str]  # (key, swatches, explanation)


def _solid(color: str, stroke: str | None = None, dashed: bool = False) -> Fill:
    return Fill(Rect(0, 0, _SW_W, _SW_H), color, stroke, dashed)


def _who_items(threads: Sequence[_Thread], named: Mapping[int, _Thread], unit: str = "thread") -> list[_Item]:
    """Legend entries naming the threads: one per role whose names the PUs show, or
    the colours of the thread numbers."""
    if not threads[0].prefix:
        shown = min(len(threads), len(_PALETTE))
        repeat = f", repeating every {len(_PALETTE)}" if len(threads) > len(_PALETTE) else ""
        return [(_UNITS[unit]["many"], [((_solid(_PALETTE[i]),), str(i)) for i in range(shown)],
                 f"{_UNITS[unit]['numbers']}, coloured by number{repeat}")]
    items: list[_Item] = []
    for role, (prefix, color) in ROLES.items():
        ranks = sorted(t.rank for t in named.values() if t.prefix == prefix)
        if ranks:
            n = len(ranks)
            items.append((f"role-{role}", [((_solid(color),), f"{prefix}{ranks[0]}")],
                          f"{role}, {ROLE_WORDS[role]}: {n} thread{'s' if n != 1 else ''} "
                          f"({_names_text([(prefix, r) for r in ranks])})"))
    return items


def _how_items(threads: Sequence[_Thread], on_pu: Mapping[int, Sequence[_Thread]],
               named: Mapping[int, _Thread], unit: str = "thread") -> list[_Item]:
    """Legend entries for how threads sit on PUs, each only when the picture has it."""
    words = _UNITS[unit]
    items: list[_Item] = []
    alone = next((t for t in threads if not t.floating and t.number in named), None)
    floating = next((t for t in threads if t.floating and t.number in named), None)
    if alone is not None:
        items.append(("alone", [((_solid(alone.color),), alone.name)], "bound to this PU alone"))
    if floating is not None:
        items.append(("floating", [((_solid(_tint(floating.color), _shade(floating.color), True),),
                                    floating.name)],
                      words["floating"]))
    if any(len(ts) > 1 for ts in on_pu.values()):
        half = _SW_W // 2
        items.append(("shared", [((Fill(Rect(0, 0, half, _SW_H), _PALETTE[0]),
                                   Fill(Rect(half, 0, _SW_W - half, _SW_H), _PALETTE[1])), "0,1")],
                      words["shared"]))
    hidden = len(threads) - len(named)
    if hidden or any(len(ts) > _STRIPES_MAX for ts in on_pu.values()):
        items.append(("many", [((_solid(_MANY, "#6f7f99"),), "+N")],
                      f"+N: N more {words['many']} may run here ({hidden} named nowhere: see the bind map)"
                      if hidden else f"more than {_STRIPES_MAX} {words['many']}: the first ones, then +N for the rest"))
    return items


def _legend(topo: Topology, threads: Sequence[_Thread], on_pu: Mapping[int, Sequence[_Thread]],
            unit: str = "thread") -> list[_Node]:
    """Legend entries for what the picture shows (only those that occur)."""
    # (key, swatches as (fill, fill, ..., sample text), explanation); a swatch of
    # several fills is split into equal vertical stripes, like a shared PU
    items: list[_Item] = []
    sw_w, sw_h = _SW_W, _SW_H
    named = {t.number: t for ts in on_pu.values() for t in _named(ts)}  # what the labels show
    if threads:
        items += _who_items(threads, named, unit) + _how_items(threads, on_pu, named, unit)
    if topo.allowed != topo.cpuset:
        items.append(("disallowed", [((_solid(_PU_OFF[0], _PU_OFF[1], True),), "P#")],
                      f"not allowed to this process (allowed: {format_list(topo.allowed)})"))
    out = []
    for key, swatches, text in items:
        text = _fit(text, 560, 10)
        x_text = len(swatches) * (sw_w + 2) + 4
        node = _Node("legend-item", f"legend-{key}", x_text + _text_w(text, 10), sw_h, _BG, _BG,
                     tooltip=text)
        for j, (fills, sample) in enumerate(swatches):
            dx = j * (sw_w + 2)
            for f in fills:
                node.fills.append(Fill(Rect(dx + f.rect.x, f.rect.y, f.rect.w, f.rect.h),
                                       f.fill, f.stroke, f.dashed))
            node.labels.append(Label(x=dx + sw_w // 2, y=12, text=_fit(sample, sw_w, 9), size=9,
                                     color="#ffffff" if key == "disallowed" else _INK, anchor="middle", bold=True,
                                     kind="legend"))
        node.labels.append(Label(x=x_text, y=12, text=text, size=10, color=_INK, anchor="start", bold=False,
                                 kind="legend"))
        out.append(node)
    return out


def _description(topo: Topology, threads: Sequence[_Thread], head: str, unit: str = "thread") -> str:
    lines = [head, f"Machine: {topo.describe()}."]
    if topo.allowed != topo.cpuset:
        lines.append(f"Allowed to this process: OS procs {format_list(topo.allowed)}.")
    for t in threads:
        where = f"OS proc {min(t.cpus)}" if not t.floating else f"OS procs {format_list(t.cpus)}"
        lines.append(f"{_UNITS[unit]['one'].capitalize()} {t.number}" + (f" ({t.name})" if t.prefix else "")
                     + f": {where}.")
    if not threads:
        lines.append(f"No {_UNITS[unit]['many']} drawn.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# SVG back-end
# ---------------------------------------------------------------------------

def _esc(s: str) -> str:
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _svg_rect(r: Rect, fill: str, stroke: str | None, dashed: bool, width: str = "1") -> str:
    s = f'<rect x="{r.x}" y="{r.y}" width="{r.w}" height="{r.h}" fill="{fill}"'
    if stroke:
        s += f' stroke="{stroke}" stroke-width="{width}"'
        if dashed:
            s += ' stroke-dasharray="3 2"'
    return s + "/>"


def _svg_label(lb: Label) -> str:
    s = f'<text x="{lb.x}" y="{lb.y}" font-size="{lb.size}"'
    if lb.anchor != "start":
        s += f' text-anchor="{lb.anchor}"'
    if lb.bold:
        s += ' font-weight="bold"'
    if lb.color != _INK:
        s += f' fill="{lb.color}"'
    if lb.kind:
        s += f' class="{lb.kind}"'
    if lb.kind == "threads":  # a white halo: the names stay readable over the threads' stripes
        s += f' stroke="{_BG}" stroke-width="3" paint-order="stroke"'
    return s + f">{_esc(lb.text)}</text>"


def _svg_box(b: Box, out: list[str], depth: int) -> None:
    ind = "  " * depth
    attrs = "".join(f' {k}="{_esc(v)}"' for k, v in b.attrs)
    out.append(f'{ind}<g id="{b.key}" class="{b.kind}"{attrs}>')
    if b.tooltip:
        out.append(f"{ind}  <title>{_esc(b.tooltip)}</title>")
    if b.kind != "legend-item":
        out.append(ind + "  " + _svg_rect(b.rect, b.fill, b.stroke, b.dashed))
    for f in b.fills:
        out.append(ind + "  " + _svg_rect(f.rect, f.fill, f.stroke, f.dashed))
    for lb in b.labels:
        out.append(ind + "  " + _svg_label(lb))
    for c in b.children:
        _svg_box(c, out, depth + 1)
    out.append(f"{ind}</g>")


def _svg(lay: Layout) -> str:
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{lay.width}" height="{lay.height}" '
           f'viewBox="0 0 {lay.width} {lay.height}" role="img" '
           f'aria-labelledby="picture-title picture-desc" shape-rendering="crispEdges" '
           f'font-family="{_FONT_FAMILY}">',
           f'  <title id="picture-title">{_esc(lay.title)}</title>',
           f'  <desc id="picture-desc">{_esc(lay.description)}</desc>',
           f'  <rect x="0" y="0" width="{lay.width}" height="{lay.height}" fill="{lay.background}"/>']
    for lb in lay.labels:
        out.append("  " + _svg_label(lb))
    _svg_box(lay.machine, out, 1)
    if lay.legend is not None:
        _svg_box(lay.legend, out, 1)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_svg(topology: Topology, cpusets: Sequence[Iterable[int]] | None = None, *,
               title: str | None = None, roles: Sequence[str] | None = None,
               max_columns: int | None = None, unit: str = "thread",
               gpu_labels: Mapping[str, str] | None = None) -> str:
    """The picture as an SVG document.

    Every box is a ``<g>`` with ``id`` (its :attr:`Box.key`), ``class`` (its kind),
    a ``<title>`` tooltip and ``data-*`` facts (a PU's ``data-os-index``,
    ``data-threads``, ``data-allowed``, ...); all text is ``<text>``.

    Parameters
    ----------
    topology, cpusets, title, roles, max_columns, unit, gpu_labels
        As for :func:`layout`.

    Returns
    -------
    str
        The SVG document.

    Raises
    ------
    PictureError
        As for :func:`layout`.
    """
    return _svg(layout(topology, cpusets, title=title, roles=roles, max_columns=max_columns, unit=unit,
                       gpu_labels=gpu_labels))


# ---------------------------------------------------------------------------
# PNG back-end (Pillow)
# ---------------------------------------------------------------------------

def _pillow() -> tuple[Any, Any, Any]:
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as e:
        raise PictureUnavailableError(
            "PNG pictures need Pillow: pip install 'kmp-affinity[picture]' (or write .svg)") from e
    return Image, ImageDraw, ImageFont


@functools.lru_cache(maxsize=64)
def png_font(size: int, *, bold: bool = False, sans: bool = False) -> Any:
    """A TrueType font for PNG text (DejaVu Sans Mono, or DejaVu Sans with ``sans``),
    else Pillow's default at that size: every PNG this package draws uses it, so that
    text keeps its spaces (Pillow's old bitmap font draws some of them zero-wide)."""
    _, _, ImageFont = _pillow()
    family = "DejaVuSans" if sans else "DejaVuSansMono"
    for name in ([f"{family}-Bold.ttf"] if bold else []) + [f"{family}.ttf"]:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed-size bitmap font
        return ImageFont.load_default()


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _png(lay: Layout, scale: int) -> bytes:
    Image, ImageDraw, ImageFont = _pillow()
    img = Image.new("RGB", (lay.width * scale, lay.height * scale), _rgb(lay.background))
    draw = ImageDraw.Draw(img)

    def font(size: int, bold: bool) -> Any:
        return png_font(size * scale, bold=bold)

    def rect(r: Rect, fill: str, stroke: str | None, dashed: bool) -> None:
        x0, y0 = r.x * scale, r.y * scale
        x1, y1 = r.right * scale - 1, r.bottom * scale - 1
        draw.rectangle((x0, y0, x1, y1), fill=_rgb(fill))
        if not stroke:
            return
        col = _rgb(stroke)
        if not dashed:
            draw.rectangle((x0, y0, x1, y1), outline=col, width=scale)
            return
        t = scale - 1  # line thickness - 1
        dash, gap = 3 * scale, 2 * scale
        for a in range(x0, x1 + 1, dash + gap):  # top and bottom edges
            b = min(a + dash - 1, x1)
            draw.rectangle((a, y0, b, y0 + t), fill=col)
            draw.rectangle((a, y1 - t, b, y1), fill=col)
        for a in range(y0, y1 + 1, dash + gap):  # left and right edges
            b = min(a + dash - 1, y1)
            draw.rectangle((x0, a, x0 + t, b), fill=col)
            draw.rectangle((x1 - t, a, x1, b), fill=col)

    def label(lb: Label) -> None:
        anchor = "ms" if lb.anchor == "middle" else "ls"
        f = font(lb.size, lb.bold)
        halo = {"stroke_width": scale, "stroke_fill": _rgb(_BG)} if lb.kind == "threads" else {}
        try:  # (thread names get a white halo over the threads' stripes, as in SVG)
            draw.text((lb.x * scale, lb.y * scale), lb.text, fill=_rgb(lb.color), font=f, anchor=anchor, **halo)
        except ValueError:  # bitmap fonts take no anchor
            w = draw.textlength(lb.text, font=f)
            x = lb.x * scale - (w / 2 if lb.anchor == "middle" else 0)
            draw.text((x, lb.y * scale - lb.size * scale), lb.text, fill=_rgb(lb.color), font=f)

    for lb in lay.labels:
        label(lb)
    for b in lay.boxes():
        if b.kind != "legend-item":
            rect(b.rect, b.fill, b.stroke, b.dashed)
        for f in b.fills:
            rect(f.rect, f.fill, f.stroke, f.dashed)
        for lb in b.labels:
            label(lb)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def render_png(topology: Topology, cpusets: Sequence[Iterable[int]] | None = None, *,
               title: str | None = None, roles: Sequence[str] | None = None,
               max_columns: int | None = None, scale: int = 1, unit: str = "thread",
               gpu_labels: Mapping[str, str] | None = None) -> bytes:
    """The picture as PNG bytes, drawn with Pillow from the same :func:`layout` as the SVG.

    Parameters
    ----------
    topology, cpusets, title, roles, max_columns, unit, gpu_labels
        As for :func:`layout`.
    scale : int
        A positive integer that multiplies every dimension (2 for sharp images
        on high-density screens).

    Returns
    -------
    bytes
        The PNG file's content.

    Raises
    ------
    PictureError
        A bad ``scale``, or as for :func:`layout`.
    PictureUnavailableError
        Pillow is not installed.
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise PictureError(f"scale must be a positive integer, got {scale!r}")
    lay = layout(topology, cpusets, title=title, roles=roles, max_columns=max_columns, unit=unit,
                 gpu_labels=gpu_labels)
    return _png(lay, scale)


_WRITERS = {".svg": "svg", ".png": "png"}


def check_path(path: str, option: str = "") -> str:
    """``path`` where a picture can be written, checked before any work: an extension
    of :data:`_WRITERS`, Pillow for a PNG, a folder that exists and is writable.

    Raises
    ------
    PictureError
        (a ``ValueError``) naming ``path`` (after ``option``, where given).
    """
    said = f"{option} {path!r}" if option else repr(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in _WRITERS:
        raise PictureError(f"{said}: write {' or '.join(_WRITERS)}")
    if ext == ".png":
        try:
            importlib.import_module("PIL.Image")
        except ImportError:
            raise PictureError(f"{said}: a PNG needs Pillow (pip install 'kmp-affinity[picture]'); "
                               f"or write .svg") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise PictureError(f"{said}: folder {folder} does not exist or is not writable")
    return path


def save(path: str | os.PathLike[str], topology: Topology,
         cpusets: Sequence[Iterable[int]] | None = None, **kw: Any) -> None:
    """Write the picture to ``path``: SVG or PNG chosen by the extension.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write; its extension (``.svg``, ``.png``, any case) picks the format.
    topology, cpusets
        As for :func:`layout`.
    **kw
        As for :func:`render_svg` / :func:`render_png` (``scale`` for PNG only).

    Raises
    ------
    PictureError
        Any other extension, or ``scale`` for an SVG file (before anything is
        written), or as for :func:`render_svg` / :func:`render_png`.
    PictureUnavailableError
        A PNG file without Pillow.
    OSError
        The file cannot be written.
    """
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    kind = _WRITERS.get(ext)
    if kind is None:
        raise PictureError(f"{p!r}: cannot tell the picture format from extension {ext or '(none)'!r}; "
                           f"use one of {', '.join(sorted(_WRITERS))}")
    if kind == "svg":
        if "scale" in kw:
            raise PictureError(f"{p!r}: scale applies to PNG pictures only")
        data = render_svg(topology, cpusets, **kw).encode("utf-8")
    else:
        data = render_png(topology, cpusets, **kw)
    with open(p, "wb") as fh:
        fh.write(data)
