"""preload_library: the library path from the package's file list, and its mapping in a running process.

Fixtures under tests/fixtures/preload/ are real outputs from a Debian bookworm amd64 node with the ppc64el and
armhf instances of libjemalloc2 installed beside the native one: ``dpkg -L`` lists, the first 20 bytes of each
libjemalloc.so.2 (hex), and ``/proc/<pid>/maps`` of ``sleep`` started with LD_PRELOAD set to each path (the
loader's stderr next to it).
"""

import json
import os
import shutil

import preload_library
import pytest
from conftest import FIXTURES

from ansible.module_utils.testing import patch_module_args

PRELOAD = os.path.join(FIXTURES, "preload")


def fixture(*parts):
    with open(os.path.join(PRELOAD, *parts), encoding="utf-8") as handle:
        return handle.read()


def header(arch):
    return bytes.fromhex(fixture("elf", "libjemalloc.so.2-%s.hex" % arch).strip())


@pytest.mark.parametrize("arch, directory", [
    ("amd64", "x86_64-linux-gnu"), ("ppc64el", "powerpc64le-linux-gnu"), ("armhf", "arm-linux-gnueabihf")])
def test_jemalloc_path_is_the_packages_multiarch_directory(arch, directory):
    # uname -m says ppc64le / armv7l; the package installs into powerpc64le-linux-gnu / arm-linux-gnueabihf.
    listing = fixture("dpkg-L", "libjemalloc2-" + arch)
    assert preload_library.library_candidates(listing, "libjemalloc.so.2") == ["/usr/lib/%s/libjemalloc.so.2" % directory]


def test_tcmalloc_soname_link_not_the_debug_or_versioned_file():
    listing = fixture("dpkg-L", "libtcmalloc-minimal4-amd64")
    assert preload_library.library_candidates(listing, "libtcmalloc_minimal.so.4") == [
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"]
    assert preload_library.library_candidates(listing, "libjemalloc.so.2") == []


def test_dpkg_query_is_qualified_with_the_native_architecture():
    # Unqualified, dpkg-query refuses a package installed for two architectures (real message in the fixture).
    assert "ambiguous package name 'libjemalloc2'" in fixture("dpkg-L", "libjemalloc2-ambiguous.stderr")
    assert preload_library.file_list_command("dpkg", "libjemalloc2", "ppc64el") == [
        "dpkg-query", "-L", "libjemalloc2:ppc64el"]
    assert preload_library.file_list_command("rpm", "jemalloc") == ["rpm", "-ql", "jemalloc"]


def test_elf_identity_of_real_headers():
    identities = {arch: preload_library.elf_identity(header(arch)) for arch in ("amd64", "ppc64el", "armhf")}
    assert identities == {"amd64": (2, 62), "ppc64el": (2, 21), "armhf": (1, 40)}
    assert preload_library.describe_identity(identities["ppc64el"]) == "64-bit PowerPC64"
    assert preload_library.elf_identity(b"#!/bin/sh\n" + bytes(10)) is None


def test_choose_library_wants_an_existing_file_for_this_machine(tmp_path):
    paths = {}
    for arch in ("amd64", "ppc64el", "armhf"):
        paths[arch] = tmp_path / arch / "libjemalloc.so.2"
        paths[arch].parent.mkdir()
        paths[arch].write_bytes(header(arch) + bytes(100))
    amd64 = preload_library.elf_identity(header("amd64"))
    # RPM multilib style: a 32-bit and a 64-bit file of the same name; the one for this machine wins.
    assert preload_library.choose_library([str(paths["armhf"]), str(paths["amd64"])], amd64, "jemalloc",
                                          "libjemalloc.so.2") == str(paths["amd64"])
    with pytest.raises(preload_library.PreloadError) as foreign:
        preload_library.choose_library([str(paths["ppc64el"])], amd64, "libjemalloc2", "libjemalloc.so.2")
    assert str(foreign.value) == ("no loadable libjemalloc.so.2 in package libjemalloc2: %s is 64-bit PowerPC64, "
                                  "this host runs 64-bit x86-64" % paths["ppc64el"])
    missing = str(tmp_path / "gone" / "libjemalloc.so.2")
    with pytest.raises(preload_library.PreloadError, match="is listed but missing \\(reinstall libjemalloc2\\)"):
        preload_library.choose_library([missing], amd64, "libjemalloc2", "libjemalloc.so.2")
    with pytest.raises(preload_library.PreloadError, match="^package libjemalloc2 lists no file named libjemalloc.so.2$"):
        preload_library.choose_library([], amd64, "libjemalloc2", "libjemalloc.so.2")


JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def test_maps_with_jemalloc_preloaded():
    assert preload_library.mapping_of(fixture("maps", "sleep-jemalloc-amd64"), JEMALLOC) is False
    mapped = preload_library.parse_maps(fixture("maps", "sleep-jemalloc-amd64"))
    assert "/usr/bin/sleep" in mapped and not any(path.startswith("[") for path in mapped)


@pytest.mark.parametrize("case", ["none", "wrong-multiarch", "foreign-machine"])
def test_maps_without_jemalloc_when_the_loader_ignored_the_preload(case):
    maps = fixture("maps", "sleep-" + case)
    assert preload_library.mapping_of(maps, JEMALLOC) is None
    assert not [path for path in preload_library.parse_maps(maps) if "jemalloc" in path]
    if case != "none":
        assert "cannot be preloaded" in fixture("maps", "sleep-%s.stderr" % case)


def test_maps_show_the_resolved_name_of_a_symlinked_library():
    maps = fixture("maps", "sleep-tcmalloc-amd64")
    assert preload_library.mapping_of(maps, "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4") is None
    assert preload_library.mapping_of(maps, "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10") is False


def test_maps_of_a_library_replaced_on_disk():
    assert preload_library.mapping_of(fixture("maps", "sleep-jemalloc-deleted"), "/opt/old/libjemalloc.so.2") is True


def run(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            preload_library.main()
    return json.loads(capsys.readouterr().out)


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs a dpkg system")


@needs_dpkg
def test_module_finds_libc_and_sees_it_mapped_in_this_process(capsys):
    result = run({"package": "libc6", "library": "libc.so.6", "pid": os.getpid()}, capsys)
    assert result.get("failed") is not True, result
    assert (result["manager"], result["mapped"], result["changed"]) == ("dpkg", True, False)
    assert result["realpath"] == os.path.realpath(result["file"])
    assert result["file"].endswith("-linux-gnu/libc.so.6")


@needs_dpkg
def test_module_fails_when_the_library_is_not_mapped(capsys):
    # libmemusage.so ships in libc6 but only memusage(1) preloads it.
    result = run({"package": "libc6", "library": "libmemusage.so", "pid": os.getpid()}, capsys)
    assert result["failed"] is True
    assert result["mapped"] is False
    assert result["msg"] == ("%s is not mapped in process %d: the loader ignored LD_PRELOAD (its message is in the "
                             "process's stderr, e.g. the journal of the service)" % (result["realpath"], os.getpid()))


@needs_dpkg
def test_module_fails_clearly_for_a_package_that_is_not_installed(capsys):
    result = run({"package": "llmtune-no-such-package", "library": "libjemalloc.so.2"}, capsys)
    assert result["failed"] is True
    assert result["msg"] == ("files of package llmtune-no-such-package: dpkg-query: package "
                             "'llmtune-no-such-package' is not installed")
