"""roles/inference_service/files/host-cpu-variants.sh: the llama.cpp CPU variants a build for this CPU keeps.

Real /proc/cpuinfo of each fixture machine against the variant list of the pinned llama.cpp release; the right
answer is the variant ggml's own score (ggml-cpu/arch/x86/cpu-feats.cpp) loads there, then the fallback (AMX only).
"""

import os
import subprocess

import pytest
from conftest import FIXTURES, ROOT

SCRIPT = os.path.join(ROOT, "roles", "inference_service", "files", "host-cpu-variants.sh")
SOURCE = os.path.join(FIXTURES, "llama.cpp-0.3.36")


@pytest.mark.parametrize("machine, variants", [
    # Kaby Lake Xeon E3: AVX2, no AVX-512.
    ("container-cgroup2", ["haswell"]),
    # Zen 2 EPYC: AVX2 only.
    ("epyc-1socket", ["haswell"]),
    # Zen 3 EPYC (the machine of 2026-12-06): AVX2 only.
    ("epyc-zen3-kvm-2vcpu", ["haswell"]),
    # Zen 4 EPYC (the machine of 2026-12-07): AVX-512 with VBMI, VNNI and BF16.
    ("epyc-zen4-kvm-2vcpu", ["zen4"]),
    # Alder Lake: AVX-VNNI without AVX-512.
    ("intel-hybrid", ["alderlake"]),
    # Ice Lake Xeon: AVX-512 with VBMI and VNNI, no BF16.
    ("xeon-2socket", ["icelake"]),
    # Cascade Lake in KVM: AVX-512 VNNI without VBMI.
    ("kvm-socket-per-vcpu", ["cascadelake"]),
    # Emerald Rapids CI VM: AMX int8; zen4 (AVX-512 with VBMI, VNNI, BF16) if its AMX kernel dies.
    ("kvm-ci-vm", ["sapphirerapids", "zen4"]),
    # Graviton 3: not x86, nothing chosen (the build keeps every variant).
    ("arm-graviton3", []),
])
def test_variants_for_the_cpu(machine, variants):
    cpuinfo = os.path.join(FIXTURES, "topology", machine, "proc", "cpuinfo")
    out = subprocess.run([SCRIPT, SOURCE, cpuinfo], capture_output=True, text=True, check=True).stdout
    assert out.split() == variants
