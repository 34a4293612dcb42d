"""The documentation: pictures are the planner's output, the site builds with no
broken link, the README's example runs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_pictures", DOCS / "gen_pictures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pictures_in_the_docs_are_the_planners_output():
    gen = _gen()
    files = gen.render_all()
    names = {n for n, *_ in gen.PICTURES}
    assert {"compact", "scatter", "compact-1"} <= names  # the three the issue names
    for rel, content in files.items():
        committed = (DOCS / rel).read_text()
        assert committed == content, f"docs/{rel} is stale: run 'make docs'"
    # and each picture shows exactly the plan's threads on each PU
    import xml.etree.ElementTree as ET

    from affinity import plan
    from affinity.machine.topology import Topology

    topo = Topology.from_synthetic(gen.MACHINE)
    for name, spec, n, _ in gen.PICTURES:
        p = plan(spec, threads=n, topology=topo)
        drawn = {}
        for el in ET.fromstring(files[f"img/{name}.svg"]).iter():
            if el.get("data-thread-names") is not None and el.get("data-os-index"):
                ts = el.get("data-threads")
                drawn[int(el.get("data-os-index"))] = {int(t) for t in ts.split(",")} if ts else set()
        assert drawn == {u.os_index: {i for i, s in enumerate(p.cpusets) if u.os_index in s}
                         for u in topo.pus}, name


def test_site_builds_strictly(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "plan_env" in api and "Binding" in api  # generated from the docstrings


def test_readme_example_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README has no python example"
    r = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    # the comments in the example state its output: check the ones that are stable
    for line in blocks[0].splitlines():
        m = re.match(r"print\((.*)\)\s+# (.+)$", line.strip())
        if m and not m.group(2).startswith(("bind", "this")):
            assert m.group(2).split(":")[0].strip() in r.stdout, line


def test_the_documented_apply_signature_is_apply_s():
    """docs/index.md listed apply(..., env, inter, ...): keywords apply() does not take
    (they are export= and inter_placement=), and not rank, torch, dataloader_workers, runtime."""
    import inspect

    import affinity

    text = " ".join((DOCS / "index.md").read_text().split())
    m = re.search(r"`affinity\.apply\(([^)]*)\)`", text)
    assert m, "docs/index.md documents no affinity.apply(...) signature"
    documented = [w.strip() for w in m.group(1).split(",") if w.strip() != "*"]
    assert documented == list(inspect.signature(affinity.apply).parameters)
