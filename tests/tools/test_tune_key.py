"""What a study of ``affinity tune`` is keyed by (:mod:`affinity.tools.tune_key`): the
files a command names or runs with ``python -m``, and whether its work splits."""

from __future__ import annotations

from affinity.tools.tune_key import StudyKey, command_files, reads_instance_share, unkeyed_modules


def test_python_dash_m_is_keyed_by_the_modules_file_found_from_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wmod.py").write_text("print(1)\n")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")  # found, never run
    (pkg / "__main__.py").write_text("print(2)\n")
    (pkg / "sub.py").write_text("print(3)\n")
    assert command_files(["python3", "-m", "wmod", "--x"]) == [str(tmp_path / "wmod.py")]
    assert command_files(["python3", "-u", "-mpkg"]) == [str(pkg / "__main__.py")]
    assert command_files(["python3.12", "-X", "dev", "-m", "pkg.sub"]) == [str(pkg / "sub.py")]
    assert command_files(["numactl", "-m", "wmod", "ls"]) == []  # not python's -m
    assert unkeyed_modules(["python3", "-m", "wmod"]) == []
    assert unkeyed_modules(["python3", "-m", "no_such_module_here"]) == ["no_such_module_here"]


def test_only_a_file_that_reads_the_count_splits_the_work(tmp_path, monkeypatch):
    """Mentioning AFFINITY_INSTANCE alone switched to split mode: a share needs the count."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.py").write_text("import os\nprint(os.environ.get('AFFINITY_INSTANCE'))\n")
    (tmp_path / "share.py").write_text("import os\nk = os.environ['AFFINITY_NUM_INSTANCES']\n")
    assert reads_instance_share(["python3", "one.py"]) is None
    assert reads_instance_share(["python3", "share.py"]) == "share.py"
    assert reads_instance_share(["python3", "-m", "share"]) == str(tmp_path / "share.py")


def test_a_key_names_what_differs_from_a_stored_one(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("1")
    b.write_text("2")
    old = StudyKey.of(["python3", str(a)], {"N": "1"}, "throughput, copies").to_attr()
    new = StudyKey.of(["python3", str(b)], {"N": "2"}, "throughput, copies")
    assert new.changes(old) == [f"command was 'python3 {a}'", "b.py is new", "variables changed: N"]
