# -*- coding: utf-8 -*-
"""The engines the service can run: one adapter file each (module_utils/llmtune_engine_<engine>.py, a subclass of
module_utils/llmtune_engine.py's Engine). docs/engines.md lists the files a new engine takes."""

from __future__ import annotations

from ansible.module_utils.llmtune_engine_llama_cpp import LlamaCpp
from ansible.module_utils.llmtune_engine_transformers import Transformers
from ansible.module_utils.llmtune_engine_vllm import Vllm

ENGINES = {engine.name: engine for engine in (Transformers(), LlamaCpp(), Vllm())}


def adapter(engine):
    """The adapter of ENGINE; ValueError for an engine that has none."""
    try:
        return ENGINES[engine]
    except KeyError:
        raise ValueError(f"no adapter for engine {engine!r}; the engines are {', '.join(sorted(ENGINES))}") from None
