# Copyright: llmtune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mitogen's linear strategy (requirements.txt), found through ansible.cfg's strategy_plugins.

Mitogen keeps one Python interpreter per host for the whole run and runs each module in it, with its imports
already loaded: a task no longer starts Python and imports Ansible's module code on the host. It takes over the ssh,
local and podman connections; others run as they would under the linear strategy.

Mitogen pins its processes to CPUs and, on fewer than 4, every command they start to all but CPU 0: on 2 CPUs a
llama.cpp compile on the controller, or a benchmark a module runs on a node, gets one CPU. The base policy pins
nothing.
"""

from __future__ import annotations

import ansible_mitogen.affinity
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule

ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

__all__ = ["StrategyModule"]
