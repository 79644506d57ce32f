"""Bracketed choice files, governor lists and cpuidle states (module_utils/llmtune_sysfs.py) on fixture trees."""

import os

from conftest import FIXTURES

from ansible.module_utils.llmtune_sysfs import parse_bracketed, parse_word_list, read_cpuidle_states, read_text

TUNING = os.path.join(FIXTURES, "tuning")
XEON = os.path.join(TUNING, "xeon-spr")
EPYC = os.path.join(TUNING, "epyc-acpi")
GRAVITON = os.path.join(TUNING, "graviton3")
THP = "/sys/kernel/mm/transparent_hugepage/"


def test_thp_enabled_and_defrag():
    assert parse_bracketed(read_text(XEON, THP + "enabled")) == ("madvise", ["always", "madvise", "never"])
    assert parse_bracketed(read_text(EPYC, THP + "enabled")) == ("always", ["always", "madvise", "never"])
    assert parse_bracketed(read_text(XEON, THP + "defrag")) == (
        "madvise", ["always", "defer", "defer+madvise", "madvise", "never"])


def test_unbracketed_and_missing_files():
    assert parse_bracketed("1") == (None, ["1"])
    assert parse_bracketed(read_text(GRAVITON, THP + "khugepaged/defrag")) == (None, [])


def test_governor_lists_with_kernel_trailing_space():
    policy = "/sys/devices/system/cpu/cpufreq/policy0/"
    assert parse_word_list(read_text(XEON, policy + "scaling_available_governors")) == ["performance", "powersave"]
    assert parse_word_list(read_text(EPYC, policy + "scaling_available_governors")) == [
        "conservative", "ondemand", "userspace", "powersave", "performance", "schedutil"]
    assert parse_word_list(read_text(XEON, policy + "energy_performance_available_preferences")) == [
        "default", "performance", "balance_performance", "balance_power", "power"]
    assert parse_word_list(read_text(GRAVITON, policy + "scaling_available_governors")) == []


def test_cpuidle_states_intel_idle():
    assert read_cpuidle_states(XEON, 1) == [
        {"index": 0, "name": "POLL", "desc": "CPUIDLE CORE POLL IDLE", "latency_us": 0, "residency_us": 0,
         "disabled": False},
        {"index": 1, "name": "C1", "desc": "MWAIT 0x00", "latency_us": 1, "residency_us": 1, "disabled": False},
        {"index": 2, "name": "C1E", "desc": "MWAIT 0x01", "latency_us": 2, "residency_us": 4, "disabled": False},
        {"index": 3, "name": "C6", "desc": "MWAIT 0x20", "latency_us": 290, "residency_us": 800, "disabled": False},
    ]


def test_cpuidle_states_acpi_idle_with_a_disabled_state():
    states = read_cpuidle_states(EPYC, 0)
    assert [(s["name"], s["latency_us"], s["disabled"]) for s in states] == [
        ("POLL", 0, False), ("C1", 1, False), ("C2", 400, True)]


def test_cpuidle_states_absent():
    assert read_cpuidle_states(GRAVITON, 0) == []
    assert read_cpuidle_states(EPYC, 7) == []
