"""Pictures of a machine with thread numbers on PUs (affinity.tools.picture).

The SVG is parsed back with xml.etree and checked against the topology and
the per-thread sets given: which PU is drawn where, inside which core and
package, and which thread numbers are written on it.
"""

from __future__ import annotations

import functools
import io
import itertools
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from PIL import Image

from affinity.tools import picture
from affinity.errors import PictureError, PictureUnavailableError
from affinity.tools.picture import Rect
from affinity.machine.topology import Topology

NS = {"s": "http://www.w3.org/2000/svg"}
SVG = "{http://www.w3.org/2000/svg}"

MACHINES = {
    "2x4x2": "pack:2 [numa] core:4 pu:2",
    # the machine of Intel's KMP_AFFINITY figures: OS procs interleaved over packages and siblings
    "doc": ("package:2(indexes=0,1) [numa] core:4(indexes=0,1,2,3,0,1,2,3) "
            "pu:2(indexes=0,8,4,12,2,10,6,14,1,9,5,13,3,11,7,15)"),
    "skx": "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)",  # siblings i and i+56
    "knl": "pack:1 [numa] core:68 pu:4(indexes=4*68:1*4)",
    "1024": "pack:2 numa:2 core:64 pu:4",
    "one-node": "pack:2 core:4 pu:2",  # hwloc's single NUMA node spans both packages
}


@functools.lru_cache(maxsize=None)
def machine(name: str) -> Topology:
    return Topology.from_synthetic(MACHINES[name])


# ----------------------------------------------------------------- cpusets
def compact(t: Topology) -> list[frozenset[int]]:
    """Thread i on the PU of logical index i (siblings of a core first)."""
    return [frozenset({p.os_index}) for p in t.pus]


def scatter(t: Topology) -> list[frozenset[int]]:
    """Round robin over packages, then cores, then siblings (first siblings first)."""
    per_pkg = [[c for c in t.cores if c.package == p.logical_index] for p in t.packages]
    out = []
    for rank in range(t.threads_per_core):
        for k in range(max(len(cs) for cs in per_pkg)):
            for cs in per_pkg:
                if k < len(cs):
                    sib = sorted(cs[k].cpuset, key=lambda o: t.pu(o).thread)
                    out.append(frozenset({sib[rank]}))
    return out


def by_core(t: Topology) -> list[frozenset[int]]:
    """granularity=core: thread i may run on any PU of core i."""
    return [c.cpuset for c in t.cores]


def expected_threads(sets, os_index: int) -> list[int]:
    return [i for i, s in enumerate(sets) if os_index in s]


# ------------------------------------------------------------- SVG reading
@functools.lru_cache(maxsize=None)
def _svg_cached(name: str, kind: str, max_columns: int | None = None) -> str:
    t = machine(name)
    sets = {"none": None, "compact": compact, "scatter": scatter, "core": by_core}[kind]
    return picture.render_svg(t, None if sets is None else sets(t), max_columns=max_columns)


class Doc:
    """A parsed picture: groups by id, each group's parent group, rects and texts."""

    def __init__(self, svg: str):
        self.root = ET.fromstring(svg)
        self.groups: dict[str, ET.Element] = {}
        self.parent: dict[str, str | None] = {}

        def walk(el: ET.Element, parent: str | None) -> None:
            for child in el:
                if child.tag == SVG + "g":
                    gid = child.get("id")
                    assert gid not in self.groups, f"duplicate id {gid}"
                    self.groups[gid] = child
                    self.parent[gid] = parent
                    walk(child, gid)

        walk(self.root, None)

    def of_class(self, cls: str) -> list[ET.Element]:
        return [g for g in self.groups.values() if g.get("class") == cls]

    def rect(self, gid: str) -> Rect:
        r = self.groups[gid].find("s:rect", NS)
        return Rect(*(int(r.get(a)) for a in ("x", "y", "width", "height")))

    def texts(self, gid: str, cls: str | None = None) -> list[str]:
        return [t.text for t in self.groups[gid].findall("s:text", NS)
                if cls is None or t.get("class") == cls]

    def ancestors(self, gid: str) -> list[str]:
        out = []
        p = self.parent[gid]
        while p is not None:
            out.append(p)
            p = self.parent[p]
        return out


def text_box(t: ET.Element) -> Rect:
    """The box a <text> occupies, by the module's monospace estimate."""
    lb = picture.Label(int(t.get("x")), int(t.get("y")), t.text, int(t.get("font-size")),
                       anchor=t.get("text-anchor", "start"))
    return lb.extent


def expand(text: str) -> list[tuple[str, int]]:
    """``"i0-2,e1"`` -> [("i",0),("i",1),("i",2),("e",1)] (a PU's visible thread names)."""
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"([a-z]?)(\d+)(?:-(\d+))?", item)
        assert m, f"unexpected thread text {text!r}"
        lo = int(m.group(2))
        hi = int(m.group(3)) if m.group(3) else lo
        out.extend((m.group(1), n) for n in range(lo, hi + 1))
    return out


# ================================================================ structure
@pytest.mark.parametrize("name", ["2x4x2", "doc", "skx", "knl", "one-node"])
def test_every_pu_once_in_its_core_in_its_package(name):
    t = machine(name)
    d = Doc(_svg_cached(name, "compact"))
    pus = d.of_class("pu")
    assert sorted(int(g.get("data-os-index")) for g in pus) == sorted(p.os_index for p in t.pus)
    for pu in t.pus:
        gid = f"pu-{pu.os_index}"
        core, pkg = t.cores[pu.core], t.packages[pu.package]
        labels = [x for x in d.groups[gid].findall("s:text", NS) if x.get("class") == "pu"]
        assert [x.text for x in labels] == [f"P#{pu.os_index}"]
        assert d.rect(gid).contains(text_box(labels[0]))
        # the PU's box is inside its core's box, inside its package's box
        assert d.parent[gid] == f"core-{pu.core}"
        assert f"package-{pu.package}" in d.ancestors(gid)
        assert d.rect(f"core-{pu.core}").contains(d.rect(gid))
        assert d.rect(f"package-{pu.package}").contains(d.rect(f"core-{pu.core}"))
        assert d.texts(f"core-{pu.core}", "name") == [f"Core P#{core.os_index}"]
        assert d.texts(f"package-{pu.package}", "name")[0].startswith(f"Package P#{pkg.os_index}")


def test_interleaved_doc_machine_draws_os_indexes_where_hwloc_puts_them():
    # Facts of the doc machine (see tests/golden/doc_2s4c2t_interleaved): package 0 holds
    # the even OS procs; its second core (core id 2) holds P#2 and P#10, its third
    # (core id 1) P#4 and P#12; P#0 and P#8 are siblings.
    d = Doc(_svg_cached("doc", "none"))
    core_of = {int(g.get("data-os-index")): d.parent[g.get("id")] for g in d.of_class("pu")}
    assert core_of[0] == core_of[8]
    assert d.texts(core_of[2], "name") == ["Core P#2"] and core_of[2] == core_of[10]
    assert d.texts(core_of[4], "name") == ["Core P#1"] and core_of[4] == core_of[12]
    assert "package-0" in d.ancestors("pu-14") and "package-1" in d.ancestors("pu-15")
    # siblings left to right by rank: P#0 before P#8
    assert d.rect("pu-0").x < d.rect("pu-8").x and d.rect("pu-0").y == d.rect("pu-8").y
    # cores in logical order along the row: core ids 0, 2, 1, 3
    xs = sorted((d.rect(f"core-{i}").x, d.texts(f"core-{i}", "name")[0]) for i in range(4))
    assert [n for _, n in xs] == ["Core P#0", "Core P#2", "Core P#1", "Core P#3"]


def test_numa_nodes_inside_packages_or_around_them():
    d = Doc(_svg_cached("2x4x2", "none"))
    for p in (0, 1):
        assert d.parent[f"numa-{p}"] == f"package-{p}"
        assert d.texts(f"numa-{p}", "name") == [f"NUMANode P#{p}"]
        assert d.rect(f"package-{p}").contains(d.rect(f"numa-{p}"))
    # one node over both packages: drawn around them
    d = Doc(_svg_cached("one-node", "none"))
    assert d.parent["package-0"] == d.parent["package-1"] == "numa-0"
    assert d.rect("numa-0").contains(d.rect("package-0"))
    assert d.rect("numa-0").contains(d.rect("package-1"))
    # two nodes per package
    d = Doc(_svg_cached("1024", "none"))
    assert [d.parent[f"numa-{n}"] for n in range(4)] == ["package-0", "package-0", "package-1", "package-1"]


def _cpuinfo(tmp_path, packages: int, cores: int):
    recs = []
    n = 0
    for p in range(packages):
        for c in range(cores):
            recs.append(f"processor\t: {n}\nphysical id\t: {p}\ncore id\t: {c}\n")
            n += 1
    f = tmp_path / "cpuinfo"
    f.write_text("\n".join(recs))
    return f


def test_numa_node_split_across_packages_and_memory_only_node(tmp_path):
    # node 0 holds package 0 and half of package 1; node 2 has memory and no PU
    t = Topology.from_cpuinfo(_cpuinfo(tmp_path, 2, 2), {0: "0-2", 1: "3", 2: ""})
    d = Doc(picture.render_svg(t, compact(t)))
    assert d.parent["numa-0.0"] == "package-0" and d.parent["numa-0.1"] == "package-1"
    assert d.texts("numa-0.1", "name") == ["NUMANode P#0 (part)"]
    assert d.parent["numa-1"] == "package-1"
    assert d.parent["pu-2"] == "core-2" and d.parent["core-2"] == "numa-0.1"
    assert d.parent["pu-3"] == "core-3" and d.parent["core-3"] == "numa-1"
    assert d.groups["numa-2"].get("class") == "memory"
    assert "memory only" in d.texts("numa-2")


# ============================================================ thread labels
def _check_threads(d: Doc, t: Topology, sets):
    for pu in t.pus:
        g = d.groups[f"pu-{pu.os_index}"]
        want = expected_threads(sets, pu.os_index)
        assert g.get("data-threads") == ",".join(map(str, want)), pu
        shown = d.texts(f"pu-{pu.os_index}", "threads")
        if not want:
            assert shown == []
            continue
        assert len(shown) == 1
        assert expand(shown[0]) == [("", i) for i in want]
        assert d.rect(f"pu-{pu.os_index}").contains(
            text_box(next(x for x in g.findall("s:text", NS) if x.get("class") == "threads")))


@pytest.mark.parametrize("name", ["2x4x2", "doc", "skx", "knl"])
@pytest.mark.parametrize("kind", ["compact", "scatter", "core"])
def test_thread_numbers_on_each_pu_are_exactly_the_threads_bound_there(name, kind):
    t = machine(name)
    sets = {"compact": compact, "scatter": scatter, "core": by_core}[kind](t)
    _check_threads(Doc(_svg_cached(name, kind)), t, sets)


def test_compact_and_scatter_look_different_on_the_doc_machine():
    t = machine("doc")
    c, s = Doc(_svg_cached("doc", "compact")), Doc(_svg_cached("doc", "scatter"))
    # compact: threads 0 and 1 share core P#0 of package 0 (P#0 and its sibling P#8)
    assert c.texts("pu-0", "threads") == ["0"] and c.texts("pu-8", "threads") == ["1"]
    # scatter: thread 1 goes to the other package (P#1), the sibling P#8 gets thread 8
    assert s.texts("pu-0", "threads") == ["0"] and s.texts("pu-1", "threads") == ["1"]
    assert s.texts("pu-8", "threads") == ["8"]
    assert "package-1" in s.ancestors("pu-1")
    assert t.pu(8).core == t.pu(0).core


def test_core_granularity_sets_float_and_single_pu_sets_do_not():
    t = machine("2x4x2")
    lay = picture.layout(t, by_core(t))
    for b in lay.pus:
        assert b.floating == (True,) and b.threads == (t.pu(b.os_index).core,)
    assert all(b.floating == (False,) for b in picture.layout(t, compact(t)).pus)

    def stripes(d: Doc, gid: str) -> list[ET.Element]:
        return d.groups[gid].findall("s:rect", NS)[1:]  # after the PU's own rect

    def lightness(color: str) -> int:
        return sum(int(color[i:i + 2], 16) for i in (1, 3, 5))

    floating = stripes(Doc(_svg_cached("2x4x2", "core")), "pu-0")
    solid = stripes(Doc(_svg_cached("2x4x2", "compact")), "pu-0")
    assert len(floating) == len(solid) == 1
    assert floating[0].get("stroke-dasharray") and not solid[0].get("stroke-dasharray")
    # both are thread 0; the floating one is a paler tint of the same colour
    assert lightness(floating[0].get("fill")) > lightness(solid[0].get("fill"))
    legend = Doc(_svg_cached("2x4x2", "core"))
    assert "floats over" in " ".join(legend.texts("legend-floating"))


def test_threads_sharing_a_pu_and_many_threads_on_one_pu():
    t = machine("2x4x2")
    sets = [{0}, {1}, {0}, {0, 1}]
    d = Doc(picture.render_svg(t, sets))
    _check_threads(d, t, sets)
    assert d.texts("pu-0", "threads") == ["0,2,3"]
    assert len(d.groups["pu-0"].findall("s:rect", NS)) == 1 + 3  # the PU, then one stripe per thread
    assert "legend-shared" in d.groups
    # 12 threads on P#0 (every other number): the text is cut, but says how many it left out
    sets = [{0} if i % 2 == 0 else {5} for i in range(24)]
    lay = picture.layout(t, sets)
    b = lay.pu(0)
    assert b.threads == tuple(range(0, 24, 2))
    m = re.fullmatch(r"(.*)\+(\d+)", b.text)
    assert m, b.text
    named = [n for _, n in expand(m.group(1))]
    assert named == list(b.threads[:len(named)]) and len(named) + int(m.group(2)) == 12
    assert len(b.text) <= 9
    d = Doc(picture.render_svg(t, sets))
    assert d.groups["pu-0"].get("data-threads") == ",".join(map(str, range(0, 24, 2)))
    assert d.texts("pu-0", "threads") == [b.text]
    assert "legend-many" in d.groups


def test_roles_name_and_colour_threads_by_role():
    t = machine("2x4x2")
    sets = [{0}, {2}, {4}, {8}, {10}, {0}]
    roles = ["tf-intra", "tf-intra", "tf-intra", "tf-inter", "tf-inter", "main"]
    lay = picture.layout(t, sets, roles=roles)
    assert lay.pu(0).names == ("i0", "m0") and lay.pu(0).threads == (0, 5)
    assert lay.pu(10).names == ("e1",) and lay.pu(4).names == ("i2",)
    d = Doc(picture.render_svg(t, sets, roles=roles))
    assert d.texts("pu-0", "threads") == ["i0,m0"]
    assert d.texts("pu-10", "threads") == ["e1"]
    fill = lambda o: d.groups[f"pu-{o}"].findall("s:rect", NS)[1].get("fill")  # noqa: E731
    assert fill(2) == fill(4) == picture.ROLES["tf-intra"][1]
    assert fill(8) == fill(10) == picture.ROLES["tf-inter"][1]
    legend = " ".join(d.texts("legend-role-tf-intra"))
    assert "tf-intra, intra-op pool (TensorFlow's, PyTorch's): 3 threads" in legend and "i0" in legend
    assert "legend-role-openmp" not in d.groups
    for bad, match in [(["tf-intra"] * 5, "5 roles for 6 threads"),
                       (roles[:-1] + ["gpu"], "unknown role 'gpu'")]:
        with pytest.raises(PictureError, match=match):
            picture.layout(t, sets, roles=bad)
    with pytest.raises(PictureError, match="without cpusets"):
        picture.layout(t, roles=roles)


def test_disallowed_pus_are_marked_and_allowed_ones_are_not():
    t = machine("2x4x2").with_allowed(range(12))
    sets = by_core(t)
    d = Doc(picture.render_svg(t, sets))
    for pu in t.pus:
        g = d.groups[f"pu-{pu.os_index}"]
        r = g.find("s:rect", NS)
        off = pu.os_index >= 12
        assert g.get("data-allowed") == ("false" if off else "true")
        assert bool(r.get("stroke-dasharray")) == off
        assert ("not allowed" in g.find("s:title", NS).text) == off
    assert d.rect("pu-12") and d.groups["pu-12"].find("s:rect", NS).get("fill") != \
        d.groups["pu-0"].find("s:rect", NS).get("fill")
    assert "not allowed to this process (allowed: 0-11)" in d.texts("legend-disallowed")
    _check_threads(d, t, sets)  # threads whose set reaches a disallowed PU are still shown there
    assert "legend-disallowed" not in Doc(_svg_cached("2x4x2", "core")).groups


# ================================================================= geometry
def _check_geometry(lay: picture.Layout):
    canvas = Rect(0, 0, lay.width, lay.height)
    for b in lay.boxes():
        assert canvas.contains(b.rect), b.key
        for lb in b.labels:
            assert b.rect.contains(lb.extent), (b.key, lb.text)
        for f in b.fills:
            assert b.rect.contains(f.rect), b.key
        for x, y in itertools.combinations(b.children, 2):
            assert not x.rect.overlaps(y.rect), (x.key, y.key)
        for c in b.children:
            assert b.rect.contains(c.rect), (b.key, c.key)
    for lb in lay.labels:
        assert canvas.contains(lb.extent)
    if lay.legend is not None:
        assert not lay.legend.rect.overlaps(lay.machine.rect)
    # no two PUs overlap anywhere (sweep by x)
    rects = sorted((p.rect for p in lay.pus), key=lambda r: r.x)
    for i, r in enumerate(rects):
        for s in rects[i + 1:]:
            if s.x >= r.right:
                break
            assert not r.overlaps(s), (r, s)


@pytest.mark.parametrize("name,kind", [("2x4x2", "scatter"), ("doc", "core"), ("skx", "compact"),
                                       ("knl", "compact"), ("1024", "compact"), ("one-node", "core")])
def test_boxes_inside_canvas_and_parents_and_not_overlapping(name, kind):
    t = machine(name)
    sets = {"compact": compact, "scatter": scatter, "core": by_core}[kind](t)
    _check_geometry(picture.layout(t, sets))


def test_svg_draws_the_layout_rectangles():
    t = machine("skx")
    lay = picture.layout(t, compact(t))
    d = Doc(_svg_cached("skx", "compact"))
    keys = [b.key for b in lay.boxes()]
    assert set(keys) == set(d.groups) and len(keys) == len(set(keys))
    for b in lay.boxes():
        if b.kind != "legend-item":
            assert d.rect(b.key) == b.rect, b.key
    root = d.root
    assert (int(root.get("width")), int(root.get("height"))) == (lay.width, lay.height)
    assert root.get("viewBox") == f"0 0 {lay.width} {lay.height}"


@pytest.mark.parametrize("name", ["skx", "knl", "1024"])
def test_big_machines_stay_bounded_and_legible(name):
    t = machine(name)
    lay = picture.layout(t, compact(t))
    assert lay.width <= 1900 and lay.height <= 1900
    assert lay.height * 3 >= lay.width and lay.width * 3 >= lay.height  # not a ribbon
    for b in lay.boxes():
        assert all(lb.size >= 9 for lb in b.labels)
    for p in lay.pus:
        assert p.rect.w >= 30 and p.rect.h >= 30
        assert "\u2026" not in p.text
    # cores are wrapped into several rows inside each package
    rows = {p.rect.y for p in lay.pus if p.package == 0}
    assert len(rows) > 2


def test_max_columns_sets_cores_per_row():
    t = machine("skx")
    d = Doc(_svg_cached("skx", "none", 4))
    for n in (0, 1):
        cores = [g for g in d.of_class("core") if d.parent[g.get("id")] == f"numa-{n}"]
        xs = {d.rect(g.get("id")).x for g in cores}
        ys = {d.rect(g.get("id")).y for g in cores}
        assert len(cores) == 28 and len(xs) == 4 and len(ys) == 7
    auto = picture.layout(t)
    narrow = picture.layout(t, max_columns=2)
    assert narrow.width < auto.width and narrow.height > auto.height
    for bad in (0, -1, "4", 2.5, True):
        with pytest.raises(PictureError, match="max_columns"):
            picture.layout(t, max_columns=bad)


def test_small_machine_keeps_a_package_in_one_row():
    lay = picture.layout(machine("2x4x2"))
    for pkg in (0, 1):
        assert len({p.rect.y for p in lay.pus if p.package == pkg}) == 1


# ========================================================= document and PNG
def test_svg_is_valid_xml_with_title_and_description():
    t = machine("2x4x2")
    svg = picture.render_svg(t, scatter(t), title="scatter <16> & co")
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    assert root.find("s:title", NS).text == "scatter <16> & co"
    desc = root.find("s:desc", NS).text
    assert "2 packages x 4 cores x 2 PUs" in desc
    assert "Thread 1: OS proc 8." in desc and "Thread 15: OS proc 15." in desc
    assert root.find("s:text", NS).text == "scatter <16> & co"
    # every label is a <text> element; every box group carries a tooltip
    assert all(g.find("s:title", NS) is not None for g in root.iter(SVG + "g"))
    default = ET.fromstring(picture.render_svg(t)).find("s:title", NS).text
    assert default == t.describe()


def test_output_is_deterministic():
    t = machine("doc")
    sets = scatter(t)
    a = picture.render_svg(t, sets, title="x")
    b = picture.render_svg(machine("doc"), [list(s)[::-1] for s in sets], title="x")
    c = picture.render_svg(Topology.from_synthetic(MACHINES["doc"]), tuple(sets), title="x")
    assert a == b == c
    assert picture.render_png(t, sets) == picture.render_png(t, tuple(sets))
    assert picture.layout(t, sets) == picture.layout(t, sets)


def test_png_has_the_layout_size_and_draws_its_colours():
    t = machine("2x4x2").with_allowed(range(12))
    sets = compact(t)
    lay = picture.layout(t, sets)
    img = Image.open(io.BytesIO(picture.render_png(t, sets)))
    assert img.format == "PNG" and img.size == (lay.width, lay.height)
    img = img.convert("RGB")
    hexc = lambda xy: "#%02x%02x%02x" % img.getpixel(xy)  # noqa: E731
    for os_index in (0, 5):
        stripe = next(b for b in lay.boxes() if b.key == f"pu-{os_index}").fills[0]
        assert hexc((stripe.rect.x + 2, stripe.rect.y + 2)) == stripe.fill
    off = next(b for b in lay.boxes() if b.key == "pu-13")
    assert hexc((off.rect.x + 3, off.rect.y + 3)) == off.fill
    big = Image.open(io.BytesIO(picture.render_png(t, sets, scale=2)))
    assert big.size == (2 * lay.width, 2 * lay.height)
    with pytest.raises(PictureError, match="scale"):
        picture.render_png(t, sets, scale=0)


def test_save_picks_the_format_by_extension(tmp_path):
    t = machine("2x4x2")
    sets = compact(t)
    picture.save(tmp_path / "a.svg", t, sets, title="a")
    assert ET.parse(tmp_path / "a.svg").getroot().tag == SVG + "svg"
    assert (tmp_path / "a.svg").read_text() == picture.render_svg(t, sets, title="a")
    picture.save(str(tmp_path / "b.PNG"), t, sets, scale=2)
    assert (tmp_path / "b.PNG").read_bytes() == picture.render_png(t, sets, scale=2)
    for name in ("c.jpg", "c", "c.svg.gz"):
        with pytest.raises(ValueError, match=r"\.png, \.svg") as e:
            picture.save(tmp_path / name, t, sets)
        assert str(tmp_path / name) in str(e.value)
        assert not (tmp_path / name).exists()
    with pytest.raises(PictureError, match="PNG pictures only"):
        picture.save(tmp_path / "d.svg", t, sets, scale=2)


# ================================================================== errors
@pytest.mark.parametrize("sets,match", [
    ([{0}, {99}], r"thread 1: OS proc 99 not in this machine \(2 packages"),
    ([{0}, set()], "thread 1: empty OS proc set"),
    ([{0}, "0-3"], "thread 1: expected a set"),
    ([{0}, {"a"}], "thread 1: OS proc ids must be integers"),
    ([{0}, [1.0]], "thread 1: OS proc ids must be integers"),
    ("0-3", "cpusets must be a sequence"),
    ({0: {0}}, "cpusets must be a sequence"),
])
def test_bad_cpusets_are_refused_clearly(sets, match):
    with pytest.raises(PictureError, match=match) as e:
        picture.render_svg(machine("2x4x2"), sets)
    assert isinstance(e.value, ValueError)


def test_not_a_topology():
    with pytest.raises(PictureError, match="expected a Topology"):
        picture.layout("pack:2 core:2")


def test_png_without_pillow_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(PictureUnavailableError, match=r"affinity\[picture\]") as e:
        picture.render_png(machine("2x4x2"))
    assert isinstance(e.value, ImportError)
    assert picture.render_svg(machine("2x4x2")).startswith("<?xml")  # SVG needs nothing


def test_import_has_no_side_effects():
    code = ("import sys, affinity.tools.picture as p; "
            "print('PIL' in sys.modules, 'affinity.machine._affinity_native' in sys.modules)")  # the compiled core
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_rect_helpers():
    a = Rect(0, 0, 10, 10)
    assert a.contains(Rect(0, 0, 10, 10)) and a.contains(Rect(2, 2, 3, 3))
    assert not a.contains(Rect(5, 5, 10, 2))
    assert not a.overlaps(Rect(10, 0, 5, 5))  # touching edges
    assert a.overlaps(Rect(9, 9, 5, 5))
    assert (a.right, a.bottom) == (10, 10)


def test_a_live_tensorflow_process_shows_its_pinned_threads_and_a_legend_of_what_is_shown():
    """What ``affinity show --picture`` draws for a TF process: many threads float over
    every CPU; the pinned workers are named first on their PU, and the legend lists
    only names the picture shows (the rest are a +N, said so)."""
    t = Topology.from_synthetic("pack:1 core:2 pu:1")
    both = {0, 1}
    sets = [both, {1}, {0}, {1}, both, both, both]
    roles = ["main", "other", "tf-intra", "tf-intra", "tf-inter", "tf-inter", "tf-other"]
    lay = picture.layout(t, sets, roles=roles)
    assert lay.pu(0).names[:1] == ("i0",) and lay.pu(1).names[:2] == ("x0", "i1")
    d = Doc(picture.render_svg(t, sets, roles=roles))
    assert d.texts("pu-0", "threads")[0].startswith("i0,") and d.texts("pu-1", "threads")[0].startswith("x0,i1")
    shown = {n for o in (0, 1) for n in expand(d.texts(f"pu-{o}", "threads")[0].split("+")[0])}
    for role, (prefix, _) in picture.ROLES.items():
        listed = f"legend-role-{role}" in d.groups
        assert listed == any(p == prefix for p, _ in shown), (role, shown)
    assert "legend-role-tf-inter" not in d.groups and "legend-role-tf-other" not in d.groups
    assert "named nowhere: see the bind map" in " ".join(d.texts("legend-many"))
    # the samples of "alone" and "floating" are threads that are
    assert d.texts("legend-alone")[0] in ("i0", "x0") and d.texts("legend-floating")[0] == "m0"


def test_a_ranks_picture_speaks_of_ranks_not_threads():
    """``affinity plan --ranks 3 --picture`` drew rank shares with a legend of "thread
    numbers" where "the thread floats over" them, and PU tooltips listing "threads"."""
    from affinity.errors import PictureError
    from affinity.tools.picture import layout, render_svg

    topo = Topology.from_synthetic("pack:2 [numa] core:4 pu:2")
    shares = [range(0, 4), range(4, 8), range(8, 16)]
    lay = layout(topo, shares, unit="rank")
    texts = [box.tooltip for box in lay.legend.walk() if box.kind == "legend-item"]
    assert texts == ["rank numbers, coloured by number",
                     "a rank's share spans several PUs: its threads may run on each of them"]
    assert lay.description.splitlines()[-3:] == ["Rank 0: OS procs 0-3.", "Rank 1: OS procs 4-7.",
                                                 "Rank 2: OS procs 8-15."]
    assert lay.title == "3 ranks on " + topo.describe()
    svg = render_svg(topo, shares, unit="rank")
    assert "; ranks 2 (share 8-15)" in svg and "floats" not in svg and "thread numbers" not in svg
    plain = layout(topo, shares)  # the default stays the threads' words
    assert [b.tooltip for b in plain.legend.walk() if b.kind == "legend-item"][0] == \
        "thread numbers, coloured by number"
    with pytest.raises(PictureError, match="unit must be one of 'thread', 'rank', got 'core'"):
        layout(topo, shares, unit="core")


def test_a_shared_pu_of_several_roles_is_readable_and_every_role_says_what_it_is():
    """Issue #40, point 5: 'affinity show --picture' of a process with its main thread and
    three others crammed "m0,x0-2" edge to edge over the stripes, and the legend said
    "other" with no word of what that is."""
    t = Topology.from_synthetic("pack:1 core:2 pu:1")
    sets, roles = [{0, 1}] * 4, ["main", "other", "other", "other"]
    lay = picture.layout(t, sets, roles=roles, title="pid 1: 4 threads")
    pu = lay.pu(0)
    assert pu.text == "m0,x0-2"
    text_w = len(pu.text) * 11 * 0.62  # the thread names' font size, a monospace advance
    assert pu.rect.w - text_w >= 16  # 8 pixels or more each side
    d = Doc(picture.render_svg(t, sets, roles=roles))
    label = d.groups["pu-0"].find("s:text[@class='threads']", NS)
    assert label.get("stroke") == "#ffffff" and label.get("paint-order") == "stroke"  # a halo over the stripes
    assert " ".join(d.texts("legend-role-other")).endswith(
        "other, threads of no pool affinity knows: 3 threads (x0-2)")
    assert " ".join(d.texts("legend-role-main")).endswith("main, the process's first thread: 1 thread (m0)")
    assert set(picture.ROLE_WORDS) == set(picture.ROLES)


def test_a_title_longer_than_the_picture_is_wrapped_not_cut():
    """The ranks picture's title (a job's name and what the numbers are) was cut with an
    ellipsis on a small machine."""
    t = Topology.from_synthetic("pack:1 core:2 pu:1")
    title = "Slurm job 123456 step 0 on node gpu-node-17.cluster.example.org: each number is a rank's threads"
    lay = picture.layout(t, [{0}, {1}], title=title, unit="rank")
    lines = [lb.text for lb in lay.labels if lb.kind == "title"]
    assert len(lines) > 1 and " ".join(lines) == title
    assert all(len(line) * 14 * 0.62 <= lay.width - 20 for line in lines)
    assert lay.machine.rect.y > lay.labels[-1].y  # the machine below the last line
    short = picture.layout(t, [{0}, {1}], title="2 ranks", unit="rank")
    assert [lb.text for lb in short.labels] == ["2 ranks"] and short.machine.rect.y == 36
