"""fstab swap detection and commenting (module_utils/llmtune_sysfs.py) on installer-written fstabs."""

import os

from conftest import FIXTURES

from ansible.module_utils.llmtune_sysfs import FSTAB_SWAP_MARK, comment_fstab_swap, is_fstab_swap_line

FSTAB_DIR = os.path.join(FIXTURES, "tuning", "fstab")


def read(name):
    with open(os.path.join(FSTAB_DIR, name), encoding="utf-8") as handle:
        return handle.read()


def expected(text, swap_lines):
    """The text with exactly ``swap_lines`` (line numbers, 0-based) prefixed by the mark."""
    lines = text.splitlines(True)
    return "".join(FSTAB_SWAP_MARK + line if number in swap_lines else line for number, line in enumerate(lines))


def test_debian_installer_comments_only_the_uuid_swap_line():
    text = read("debian-installer")
    new_text, commented = comment_fstab_swap(text)
    assert commented == ["UUID=0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0 none            swap    sw              0       0"]
    assert new_text == expected(text, {13})


def test_ubuntu_cloud_keeps_tabs():
    new_text, commented = comment_fstab_swap(read("ubuntu-cloud"))
    assert commented == ["/swap.img\tnone\tswap\tsw\t0\t0"]
    assert new_text.splitlines()[2] == "#llmtune# /swap.img\tnone\tswap\tsw\t0\t0"
    assert new_text.splitlines()[:2] == read("ubuntu-cloud").splitlines()[:2]


def test_rhel9_lvm_swap_and_indented_line_but_not_commented_ones():
    text = read("rhel9")
    new_text, commented = comment_fstab_swap(text)
    assert commented == ["/dev/mapper/rhel-swap   none                    swap    defaults        0 0",
                         "  /swapfile2 swap swap pri=-5 0 0"]
    assert new_text == expected(text, {10, 11})
    assert new_text.startswith("\n#\n# /etc/fstab\n")
    assert new_text.endswith("#/dev/sdb1 none swap sw 0 0\n")


def test_raspios_without_swap_line_is_unchanged():
    text = read("raspios")
    assert comment_fstab_swap(text) == (text, [])


def test_second_pass_changes_nothing():
    once, _ = comment_fstab_swap(read("rhel9"))
    assert comment_fstab_swap(once) == (once, [])


def test_last_line_without_newline():
    assert comment_fstab_swap("/dev/sda2 none swap sw") == ("#llmtune# /dev/sda2 none swap sw", ["/dev/sda2 none swap sw"])


def test_is_fstab_swap_line():
    assert is_fstab_swap_line("/dev/sda2\tnone\tswap\tsw\t0\t0")
    assert not is_fstab_swap_line("# /dev/sda2 none swap sw 0 0")
    assert not is_fstab_swap_line("#llmtune# /dev/sda2 none swap sw 0 0")
    assert not is_fstab_swap_line("/dev/sdb1 /srv/swap ext4 defaults 0 2")
    assert not is_fstab_swap_line("")
    assert not is_fstab_swap_line("/dev/sda2 none")
