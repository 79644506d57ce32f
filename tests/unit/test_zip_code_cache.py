"""scripts/zip_code_cache.py: a module imported from a zip is compiled once, and anew when its source changes."""

import importlib.util
import os
import subprocess
import sys
import zipfile
import zipimport

import pytest

from conftest import ROOT


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = os.path.join(ROOT, "scripts", "zip_code_cache.py")
    spec = importlib.util.spec_from_file_location("zip_code_cache", path)
    module = importlib.util.module_from_spec(spec)
    compiled = []
    original = zipimport._compile_source
    monkeypatch.setattr(zipimport, "_compile_source",
                        lambda name, source: compiled.append(name) or original(name, source))
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "CACHE", str(tmp_path / "cache"))
    yield compiled, tmp_path
    zipimport._compile_source = original


def import_from_zip(path, name):
    sys.path.insert(0, str(path))
    try:
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(path))
        sys.modules.pop(name, None)
        sys.path_importer_cache.pop(str(path), None)


def write_zip(path, name, source):
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr(f"{name}.py", source)


def test_a_zipped_module_is_compiled_once_per_source(cache):
    compiled, tmp_path = cache
    for attempt in range(2):  # each a new zip of the same source, as Ansible sends each task
        write_zip(tmp_path / f"task{attempt}.zip", "llmtune_zipped_probe", "VALUE = 'one'\n")
        assert import_from_zip(tmp_path / f"task{attempt}.zip", "llmtune_zipped_probe").VALUE == "one"
    assert compiled == [str(tmp_path / "task0.zip" / "llmtune_zipped_probe.py")]
    write_zip(tmp_path / "task2.zip", "llmtune_zipped_probe", "VALUE = 'two'\n")
    assert import_from_zip(tmp_path / "task2.zip", "llmtune_zipped_probe").VALUE == "two"
    assert len(compiled) == 2 and len(os.listdir(tmp_path / "cache")) == 2


def test_install_makes_every_python3_start_load_the_cache(tmp_path):
    site_dir = tmp_path / "usr" / "lib" / "python3" / "dist-packages"
    site_dir.mkdir(parents=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "zip_code_cache.py"), str(tmp_path)], check=True)
    # Debian's python3 reads the .pth files of dist-packages at start, as site.addsitedir does here.
    loaded = subprocess.run(
        [sys.executable, "-c", f"import site, zipimport; site.addsitedir({str(site_dir)!r}); "
         "print(zipimport._compile_source.__module__)"], check=True, capture_output=True, text=True).stdout
    assert loaded.strip() == "llmtune_zip_code_cache"
