# -*- coding: utf-8 -*-
"""Hugging Face `transformers serve`: the engine adapter (module_utils/llmtune_engine.py holds the defaults)."""

from __future__ import annotations

import json

from ansible.module_utils.llmtune_engine import Engine


class Transformers(Engine):
    name = "transformers"
    title = "transformers serve"
    unkeyed_why = "transformers serve has no API key option"
    # Not told a context length: nginx's body limit comes from the model's config.json.
    reads_config = True
    # It ships no batched benchmark; a generate() batch is not the code path of `transformers serve`.
    batched_bench = False

    def model_name(self, model_path):
        """transformers serve loads models by path, and answers to it."""
        return model_path

    def fixed_length(self, max_tokens):
        """A generation_config JSON string: it builds the request's GenerationConfig from it
        (transformers/cli/serving/utils.py), so sampling is then greedy; it rejects unknown fields such as
        ignore_eos (HTTP 422)."""
        return {"generation_config": json.dumps({"min_new_tokens": max_tokens, "max_new_tokens": max_tokens})}

    def argv(self, s):
        out = [f"{s['venv']}/bin/transformers", "serve", s["model_path"], "--device", "cpu", "--host", s["host"],
               "--port", str(s["port"]), "--dtype", s["dtype"]]
        if s["continuous_batching"]:
            out.append("--continuous-batching")
        return out
