"""Tests run modules in one process, where Ansible's store of a module's warnings is a global that nothing empties.

The input: in a CI run, test_tuned_profile's module warned "tuned post-loaded profile virtual-guest is applied after
llmtune ..." and the swap module of the next test in the same process returned that warning beside its own
(test_parsers_swaps.py::test_low_memory_leaves_swap_on_but_keeps_it_off_at_boot failed). tests/conftest.py empties the
store before each test; these two tests fail without it, in this order, in one process.
"""
from ansible.module_utils import _internal
from ansible.module_utils.common import warnings

TUNED = "tuned post-loaded profile virtual-guest is applied after llmtune and may override its values"


def test_a_module_run_leaves_its_warning_in_the_store(monkeypatch):
    # As in a module's own process: once the controller's code is imported, warnings go to its display instead.
    monkeypatch.setattr(_internal, "is_controller", False)
    warnings.warn(TUNED)
    warnings.deprecate("an old option", version="2.99")
    assert warnings.get_warning_messages() == (TUNED,)
    assert len(warnings.get_deprecation_messages()) == 1


def test_the_next_test_starts_with_an_empty_store():
    assert warnings.get_warning_messages() == ()
    assert warnings.get_deprecation_messages() == ()
