"""tuned_profile: parsing of real `tuned-adm active` output, the child profile it renders, and a full run.

Fixtures under tests/fixtures/tuned/ were captured on the local node with tuned 2.20 running (see the README
there). The full runs use a stand-in tuned-adm that prints those captures.
"""

import configparser
import json
import os
import stat

import pytest
import tuned_profile
from conftest import FIXTURES

from ansible.module_utils.testing import patch_module_args

TUNED = os.path.join(FIXTURES, "tuned")


def fixture(*parts):
    with open(os.path.join(TUNED, *parts), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("case, expected", [
    ("throughput-performance", (["throughput-performance"], [], True)),
    ("virtual-guest", (["virtual-guest"], [], True)),
    ("two-profiles", (["balanced", "virtual-guest"], [], True)),
    ("post-loaded", (["throughput-performance"], ["virtual-guest"], True)),
    ("off", ([], [], True)),
    ("not-running", (["throughput-performance"], [], False)),
    ("llmtune", (["llmtune"], [], True)),
])
def test_parse_tuned_adm_active(case, expected):
    parsed = tuned_profile.parse_active(fixture("tuned-adm-active", case))
    assert (parsed["profiles"], parsed["post_loaded"], parsed["running"]) == expected


SECTIONS = {"vm": {"transparent_hugepages": "always", "transparent_hugepage.defrag": "madvise"},
            "cpu": {"governor": "performance", "energy_performance_preference": "performance", "boost": True,
                    "force_latency": 2},
            "sysctl": {"vm.swappiness": "1", "kernel.numa_balancing": "0"}}

RENDERED = """\
# llmtune: the values of its tuning roles on top of the profile tuned ran before
# (playbooks/rollback.yml selects that profile again and removes this one).
[main]
summary=llmtune: CPU inference tuning on top of throughput-performance
include=throughput-performance

[cpu]
boost=1
energy_performance_preference=performance
force_latency=2
governor=performance

[sysctl]
kernel.numa_balancing=0
vm.swappiness=1

[vm]
transparent_hugepage.defrag=madvise
transparent_hugepages=always
"""


def test_render_child_profile():
    assert tuned_profile.render_profile("llmtune", ["throughput-performance"], SECTIONS) == RENDERED


def test_rendered_profile_reads_back_as_tuned_reads_it():
    # tuned/profiles/locator.py parse_config: '=' delimiter, '#' comments, a magic section for header lines.
    parser = configparser.ConfigParser(delimiters=("=",), inline_comment_prefixes=("#",), allow_no_value=True,
                                       strict=False)
    parser.optionxform = str
    parser.read_string("[magic]\n" + tuned_profile.render_profile("llmtune", ["balanced", "virtual-guest"], SECTIONS))
    assert parser["main"]["include"] == "balanced,virtual-guest"
    assert tuned_profile.include_of(tuned_profile.render_profile("x", ["balanced", "virtual-guest"], {})) == [
        "balanced", "virtual-guest"]
    assert dict(parser["cpu"]) == {"boost": "1", "energy_performance_preference": "performance",
                                   "force_latency": "2", "governor": "performance"}
    assert dict(parser["vm"]) == {"transparent_hugepage.defrag": "madvise", "transparent_hugepages": "always"}


def test_no_previous_profile_means_no_include_line():
    text = tuned_profile.render_profile("llmtune", [], {"vm": {"transparent_hugepages": "never"}, "cpu": {}})
    assert "include=" not in text and "[cpu]" not in text
    assert tuned_profile.include_of(text) == []
    assert "summary=llmtune: CPU inference tuning\n" in text


def test_sysctl_d_lines():
    text = "# managed\n; comment\nvm.swappiness = 1\n-kernel.numa_balancing=0\n\nnot a setting\n"
    assert tuned_profile.parse_sysctl_conf(text) == {"vm.swappiness": "1", "kernel.numa_balancing": "0"}


def test_user_profile_directory_by_tuned_version():
    debian_220 = fixture("tuned-main.conf", "2.20-debian")
    upstream_225 = fixture("tuned-main.conf", "2.25-upstream")
    assert tuned_profile.user_profile_dir(debian_220, False) == "/etc/tuned"
    # 2.25 ships profile_dirs commented out; its package creates /etc/tuned/profiles.
    assert tuned_profile.user_profile_dir(upstream_225, True) == "/etc/tuned/profiles"
    assert tuned_profile.user_profile_dir(
        upstream_225 + "\nprofile_dirs = /usr/lib/tuned/profiles, /srv/tuned\n", True) == "/srv/tuned"


@pytest.fixture(name="host")
def fixture_host(tmp_path, monkeypatch, capsys):
    """A stand-in tuned-adm on PATH printing the capture named in file `active`, logging `profile` calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "tuned-adm"
    tool.write_text('#!/bin/sh\ncase "$1" in\n  active) cat "%s/active";;\n  profile) shift; echo "$*" >> "%s/calls";;\n'
                    'esac\n' % (tmp_path, tmp_path))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.setattr(tuned_profile, "ACTIVE_PROFILE", str(tmp_path / "active_profile"))
    monkeypatch.setattr(tuned_profile, "PROFILE_MODE", str(tmp_path / "profile_mode"))
    (tmp_path / "sysctl.conf").write_text("# {{ ansible_managed }}\nvm.swappiness = 1\n")

    def run(case, check_mode=False):
        (tmp_path / "active").write_text(fixture("tuned-adm-active", case))
        args = {"sections": {key: SECTIONS[key] for key in ("vm", "cpu")},
                "sysctl_files": [str(tmp_path / "sysctl.conf")], "profile_dir": str(tmp_path / "profiles"),
                "state_path": str(tmp_path / "state.json"), "_ansible_check_mode": check_mode,
                "_ansible_diff": True}
        with patch_module_args(args):
            with pytest.raises(SystemExit):
                tuned_profile.main()
        return json.loads(capsys.readouterr().out)

    run.root = tmp_path
    return run


def test_first_run_includes_the_active_profile_records_it_and_selects(host):
    result = host("throughput-performance")
    assert (result["changed"], result["file_changed"], result["selection_changed"]) == (True, True, True)
    assert result["previous"] == "throughput-performance"
    profile = (host.root / "profiles" / "llmtune" / "tuned.conf").read_text()
    assert profile == RENDERED.replace("kernel.numa_balancing=0\n", "")
    assert (host.root / "calls").read_text() == "llmtune\n"
    state = json.loads((host.root / "state.json").read_text())
    assert state["settings"]["tuned.profile"]["original"] == "throughput-performance"
    # The new directory is recorded as created: the rollback removes it whole.
    assert state["files"][str(host.root / "profiles" / "llmtune")]["existed"] is False
    # Second run: ours is active and the file is as rendered.
    again = host("llmtune")
    assert (again["changed"], again["previous"]) == (False, "throughput-performance")
    assert (host.root / "calls").read_text() == "llmtune\n"


def test_check_mode_writes_nothing(host):
    result = host("two-profiles", check_mode=True)
    assert (result["changed"], result["previous"]) == (True, "balanced virtual-guest")
    assert "include=balanced,virtual-guest\n" in result["content"]
    assert [d["after"] for d in result["diff"]] == [result["content"], "llmtune\n"]
    assert sorted(os.listdir(host.root)) == ["active", "bin", "sysctl.conf"]


def test_stopped_daemon_gets_the_profile_at_its_next_start(host):
    result = host("not-running")
    assert (result["running"], result["selection_changed"]) == (False, True)
    assert not (host.root / "calls").exists()
    assert (host.root / "active_profile").read_text() == "llmtune\n"
    assert (host.root / "profile_mode").read_text() == "manual\n"


def test_lost_state_takes_the_previous_profile_from_our_include_line(host):
    host("throughput-performance")
    (host.root / "state.json").unlink()
    again = host("llmtune")
    assert (again["previous"], again["changed"]) == ("throughput-performance", False)


def test_post_loaded_profile_is_reported(host):
    result = host("post-loaded")
    assert result["post_loaded"] == ["virtual-guest"]
    assert result["previous"] == "throughput-performance"
    assert "tuned post-loaded profile virtual-guest is applied after llmtune" in json.dumps(result["warnings"])
