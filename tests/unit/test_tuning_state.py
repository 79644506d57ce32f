"""tuning_state module and module_utils/llmtune_state.py: originals and backups recorded once."""

import json
import subprocess

import pytest
import tuning_state

from ansible.module_utils.testing import patch_module_args


def run(args, capsys, check_mode=False):
    with patch_module_args(dict(args, _ansible_check_mode=check_mode, _ansible_diff=True)):
        with pytest.raises(SystemExit):
            tuning_state.main()
    return json.loads(capsys.readouterr().out)


def test_key_recorded_once(tmp_path, capsys):
    path = str(tmp_path / "llmtune" / "state.json")
    first = run({"path": path, "key": "thp.enabled", "original": "always [madvise] never"}, capsys)
    second = run({"path": path, "key": "thp.enabled", "original": "always madvise [never]"}, capsys)
    assert (first["changed"], second["changed"]) == (True, False)
    assert second["entry"]["original"] == "always [madvise] never"
    state = json.loads(open(path).read())
    assert state["settings"]["thp.enabled"]["original"] == "always [madvise] never"
    assert oct((tmp_path / "llmtune" / "state.json").stat().st_mode & 0o777) == "0o600"


def test_check_mode_writes_nothing(tmp_path, capsys):
    path = tmp_path / "state.json"
    result = run({"path": str(path), "key": "swap.swappiness", "original": "60"}, capsys, check_mode=True)
    assert result["changed"] is True
    assert not path.exists()


def test_file_backup_once_and_missing_file(tmp_path, capsys):
    path = str(tmp_path / "state" / "state.json")
    edited = tmp_path / "etc" / "fstab"
    edited.parent.mkdir()
    edited.write_text("/swap.img none swap sw 0 0\n")
    first = run({"path": path, "file": str(edited)}, capsys)
    assert first["backup"] == str(tmp_path / "state" / "backup" / str(edited).lstrip("/"))
    edited.write_text("#llmtune# /swap.img none swap sw 0 0\n")
    second = run({"path": path, "file": str(edited)}, capsys)
    assert (first["changed"], second["changed"]) == (True, False)
    assert open(first["backup"]).read() == "/swap.img none swap sw 0 0\n"
    missing = run({"path": path, "file": str(tmp_path / "etc" / "sysctl.d" / "90-llmtune-swap.conf")}, capsys)
    assert missing["backup"] is None
    assert missing["entry"]["existed"] is False
    # Backups and the state are root's alone (the originals may hold secrets).
    assert oct((tmp_path / "state" / "backup").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "state" / "state.json").stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in (tmp_path / "state").iterdir() if p.name.startswith(".")] == []


def test_write_atomic_keeps_mode_and_replaces_whole(tmp_path):
    from ansible.module_utils.llmtune_state import write_atomic

    target = tmp_path / "tuned.conf"
    write_atomic(str(target), "new\n")
    assert (target.read_text(), oct(target.stat().st_mode & 0o777)) == ("new\n", "0o644")
    target.chmod(0o640)
    write_atomic(str(target), b"second\n", mode=0o600)
    assert (target.read_text(), oct(target.stat().st_mode & 0o777)) == ("second\n", "0o640")
    with pytest.raises(IsADirectoryError):
        write_atomic(str(tmp_path), "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuned.conf"]


def test_read_returns_whole_state(tmp_path, capsys):
    path = str(tmp_path / "state.json")
    run({"path": path, "key": "numa.numa_balancing", "original": "1"}, capsys)
    result = run({"path": path, "state": "read"}, capsys)
    assert result["changed"] is False
    assert result["state"]["settings"]["numa.numa_balancing"]["original"] == "1"
    assert result["state"]["files"] == {}
    assert run({"path": str(tmp_path / "none.json"), "state": "read"}, capsys)["state"] == {
        "version": 1, "settings": {}, "files": {}, "packages": {}}


def test_packages_recorded_only_when_absent_and_once(tmp_path, capsys):
    # dpkg-query on this Debian host: dpkg is installed everywhere, the other name is no package at all.
    path = tmp_path / "state.json"
    names = ["dpkg", "llmtune-no-such-package"]
    checked = run({"path": str(path), "packages": names}, capsys, check_mode=True)
    assert (checked["changed"], checked["packages"], path.exists()) == (True, ["llmtune-no-such-package"], False)
    first = run({"path": str(path), "packages": names}, capsys)
    second = run({"path": str(path), "packages": names}, capsys)
    assert (first["changed"], first["packages"]) == (True, ["llmtune-no-such-package"])
    assert (second["changed"], second["packages"]) == (False, [])
    assert list(json.loads(path.read_text())["packages"]) == ["llmtune-no-such-package"]


def test_damaged_state_fails_and_is_kept(tmp_path, capsys):
    path = tmp_path / "state.json"
    path.write_text("[1, 2]")
    result = run({"path": str(path), "key": "thp.defrag", "original": "madvise"}, capsys)
    assert result["failed"] is True
    assert result["msg"] == "llmtune state file %s: %s is not a JSON object" % (path, path)
    assert path.read_text() == "[1, 2]"


def test_key_and_file_are_exclusive(tmp_path, capsys):
    result = run({"path": str(tmp_path / "s.json"), "key": "a.b", "original": "1", "file": "/etc/fstab"}, capsys)
    assert result["failed"] is True
    assert "mutually exclusive" in result["msg"]


def test_kernel_path_stored_with_the_original(tmp_path):
    from ansible.module_utils.llmtune_state import record_original

    path = str(tmp_path / "state.json")
    assert record_original(path, "swap.swappiness", "60", kernel_path="/proc/sys/vm/swappiness")[0] is True
    assert record_original(path, "swap.swappiness", "1", kernel_path="/proc/sys/vm/swappiness")[0] is False
    assert record_original(path, "grub.cmdline", "quiet")[0] is True
    settings = json.loads(open(path).read())["settings"]
    assert {key: {k: v for k, v in entry.items() if k != "recorded"} for key, entry in settings.items()} == {
        "swap.swappiness": {"original": "60", "kernel_path": "/proc/sys/vm/swappiness"},
        "grub.cmdline": {"original": "quiet"}}


def test_packages_recorded_with_the_dependencies_apt_adds(tmp_path, capsys):
    # cowsay is in Debian's index and pulls in libtext-charwidth-perl; neither is on a fresh machine of this kind.
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "cowsay", "libtext-charwidth-perl"],
                               capture_output=True, text=True).stdout
    if "installed" in installed or subprocess.run(["apt-get", "-s", "-q", "install", "cowsay"],
                                                  capture_output=True).returncode:
        pytest.skip("cowsay installed here, or not in apt's index")
    result = run({"path": str(tmp_path / "state.json"), "packages": ["cowsay", "dpkg"]}, capsys, check_mode=True)
    assert result["packages"] == ["cowsay", "libtext-charwidth-perl"]


def test_packages_installed_without_recommends_are_recorded_without_them(tmp_path, capsys):
    # Debian's prometheus-node-exporter recommends prometheus-node-exporter-collectors (timers that would run beside
    # the engine); the metrics role installs it without, and a rollback must not purge a collectors package the
    # operator installed later.
    names = ["prometheus-node-exporter", "prometheus-node-exporter-collectors"]
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}"] + names, capture_output=True, text=True).stdout
    if "installed" in installed or subprocess.run(["apt-get", "-s", "-q", "install", names[0]],
                                                  capture_output=True).returncode:
        pytest.skip("the node exporter installed here, or not in apt's index")
    plain = run({"path": str(tmp_path / "state.json"), "packages": names[:1]}, capsys, check_mode=True)
    bare = run({"path": str(tmp_path / "state.json"), "packages": names[:1], "install_recommends": False}, capsys,
               check_mode=True)
    assert names[1] in plain["packages"]
    assert bare["packages"] == names[:1]
