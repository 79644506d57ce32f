"""The engine adapters, one per engine (module_utils/llmtune_engine_<engine>.py): command lines, environments and
facts, and the service's unit as the role renders it from them (library/engine_adapter.py)."""

import json

import pytest
import yaml

import engine_adapter  # noqa: E402  (library/ is on sys.path via conftest)
import inference_benchmark  # noqa: E402
from ansible.module_utils import llmtune_engines as engines  # noqa: E402
from ansible.module_utils.llmtune_engine import Engine  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402
from test_jinja_expressions import load, render, render_template_file, service_vars  # noqa: E402

def setting(**changes):
    out = {"model_path": "/opt/llmtune/models/qwen3-0.6b", "host": "127.0.0.1", "port": 8000, "threads": 2,
           "tuned": True, "template": False, "slots": 4, "context_tokens": 4096, "dtype": "bfloat16", "cpus": "0 1",
           "venv": "/opt/llmtune/venv", "program_dir": "/opt/llmtune/llama.cpp-b1", "cache_dir": "/var/cache/llm-inference",
           "api_key_file": "", "mlock": False, "cache_ram_mib": 0, "kv_bytes": 0, "continuous_batching": False,
           "extra_args": []}
    out.update(changes)
    return out


@pytest.mark.parametrize("name", sorted(engines.ENGINES))
def test_each_adapter_is_in_its_own_file_and_says_what_the_role_asks(name):
    adapter = engines.ENGINES[name]
    assert isinstance(adapter, Engine) and type(adapter).__module__.endswith("llmtune_engine_" + name)
    facts = adapter.facts("Debian")
    assert facts["name"] == name and facts["weights"] in ("gguf", "folder") and facts["health_path"].startswith("/")
    assert adapter.title
    # A program outside the venv is a GGUF server's (the llama.cpp build); every other engine installs into the venv.
    assert facts["venv"] is (facts["weights"] == "folder")
    # An engine that checks no key says why, for the operator's warning.
    assert bool(facts["unkeyed_why"]) is not facts["key_file"]
    assert type(adapter).argv is not Engine.argv


def test_an_engine_without_an_adapter_is_named_with_the_ones_there_are():
    with pytest.raises(ValueError, match="no adapter for engine 'sglang'; the engines are llama_cpp, transformers, vllm"):
        engines.adapter("sglang")
    with pytest.raises(ValueError, match="the setting lacks kv_bytes"):
        engines.adapter("vllm").unit({key: value for key, value in setting().items() if key != "kv_bytes"})


@pytest.mark.parametrize("engine, path, name", [
    ("llama_cpp", "/var/lib/llm-inference/models/qwen3-0.6b-bf16.gguf", "qwen3-0.6b-bf16"),
    ("llama_cpp", "/var/lib/llm-inference/models/qwen3xgguf", "qwen3xgguf"),
    ("vllm", "/var/lib/llm-inference/models/qwen3-0.6b", "qwen3-0.6b"),
    # transformers serve loads models by path, and answers to it.
    ("transformers", "/var/lib/llm-inference/models/qwen3-0.6b", "/var/lib/llm-inference/models/qwen3-0.6b"),
])
def test_the_model_name_clients_send(engine, path, name):
    assert engines.adapter(engine).facts("Debian", path)["model_name"] == name


@pytest.mark.parametrize("changes, expected", [
    # A context of each slot in the shared KV cache; tuned, its threads for decode and prefill.
    ({}, "/opt/llmtune/llama.cpp-b1/llama-server --model /m.gguf --alias m --host 127.0.0.1 --port 8000 --parallel 4"
         " --ctx-size 16384 --no-webui --metrics --cache-ram 0 --threads 2 --threads-batch 2"),
    # Untuned (the baseline): the server picks its own thread count. Behind nginx: its key file; weights locked.
    ({"tuned": False, "api_key_file": "/etc/k", "mlock": True, "slots": 2, "cache_ram_mib": 256},
     "/opt/llmtune/llama.cpp-b1/llama-server --model /m.gguf --alias m --host 127.0.0.1 --port 8000 --parallel 2"
     " --ctx-size 8192 --no-webui --metrics --cache-ram 256 --api-key-file /etc/k --load-mode mmap+mlock"),
    # A template unit's instance takes its port and threads from its drop-in; extra arguments quoted.
    ({"port": "${LLMTUNE_PORT}", "threads": "${LLMTUNE_THREADS}", "template": True, "extra_args": ["--temp", "0 1"]},
     "/opt/llmtune/llama.cpp-b1/llama-server --model /m.gguf --alias m --host 127.0.0.1 --port ${LLMTUNE_PORT}"
     " --parallel 4 --ctx-size 16384 --no-webui --metrics --cache-ram 0 --threads ${LLMTUNE_THREADS}"
     " --threads-batch ${LLMTUNE_THREADS} --temp '0 1'"),
])
def test_llama_server_command(changes, expected):
    unit = engines.adapter("llama_cpp").unit(setting(model_path="/m.gguf", **changes))
    assert unit["exec_start"] == expected
    assert unit["environment"] == [] and unit["sandbox"] == []


@pytest.mark.parametrize("tuned, template, bind", [
    # One engine: a thread bound to each CPU of the unit.
    (True, False, ["VLLM_CPU_OMP_THREADS_BIND=0,1"]),
    # Untuned (the baseline): vLLM binds its own threads.
    (False, False, []),
    # One engine per NUMA node: each binds its node's CPUs in its drop-in.
    (True, True, []),
])
def test_vllm_command_and_environment(tuned, template, bind):
    unit = engines.adapter("vllm").unit(setting(tuned=tuned, template=template, kv_bytes=123456789),
                        [{"unit": "llm-inference@1.service", "cpus": "2 3"}] if template else [])
    assert unit["exec_start"] == (
        "/opt/llmtune/venv/bin/python -m vllm.entrypoints.openai.api_server --model /opt/llmtune/models/qwen3-0.6b"
        " --served-model-name qwen3-0.6b --host 127.0.0.1 --port 8000 --dtype bfloat16 --max-num-seqs 4"
        " --max-model-len 4096 --kv-cache-memory-bytes 123456789 --enable-prefix-caching --disable-uvicorn-access-log")
    assert unit["environment"] == ["VLLM_CACHE_ROOT=/var/cache/llm-inference/vllm",
                                   "TORCHINDUCTOR_CACHE_DIR=/var/cache/llm-inference/torchinductor",
                                   "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1"] + bind
    assert unit["instance_environment"] == ({"llm-inference@1.service": ["VLLM_CPU_OMP_THREADS_BIND=2,3"]}
                                            if template else {})
    assert "RestrictAddressFamilies=AF_NETLINK" in unit["sandbox"]


@pytest.mark.parametrize("batching, flag", [(True, " --continuous-batching"), (False, "")])
def test_transformers_serve_command(batching, flag):
    unit = engines.adapter("transformers").unit(setting(continuous_batching=batching))
    assert unit["exec_start"] == ("/opt/llmtune/venv/bin/transformers serve /opt/llmtune/models/qwen3-0.6b --device cpu"
                                  " --host 127.0.0.1 --port 8000 --dtype bfloat16" + flag)


def run_module(args, capsys, module=engine_adapter):
    """MODULE's return (a module of library/) for ARGS."""
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out)


def test_the_module_answers_in_check_mode_and_fails_with_a_message(capsys):
    result = run_module({"engine": "vllm", "os_family": "RedHat", "_ansible_check_mode": True}, capsys)
    assert result["changed"] is False and "unit" not in result
    assert result["engine"]["system_packages"] == ["numactl-libs", "gcc-c++", "python3-devel"]
    result = run_module({"engine": "llama_cpp", "setting": {"model_path": "/m.gguf"}}, capsys)
    assert result["failed"] and result["msg"].startswith("engine_adapter: the setting lacks host, port, threads")


def service_unit(engine, layout, **changes):
    """The unit and the second instance's drop-in the role writes, from the module's return as the role calls it."""
    variables = service_vars("qemu-2node", permitted=True, inference_service_layout=layout,
                             inference_service_engine=engine, inference_service_tuned=True, **changes)
    engines_layout = variables["__inference_service_adapter"]["layout"]
    template, instances = engines_layout["per_node"], engines_layout["instances"]
    model = "/opt/llmtune/models/m.gguf" if engine == "llama_cpp" else "/opt/llmtune/models/m"
    unit = engines.adapter(engine).unit(setting(model_path=model, template=template, slots=instances[0]["slots"],
                                        port="${LLMTUNE_PORT}" if template else 8000),
                        instances if template else [])
    variables.update(ansible_managed="managed", __inference_service_model_path=model, __inference_service_allocator_lib="",
                     __inference_service_mlock={"bytes": 0, "skipped": ""}, __inference_service_engine_unit={"unit": unit},
                     __inference_service_adapter=dict(variables["__inference_service_adapter"],
                                                      engine=engines.adapter(engine).facts("Debian", model)),
                     ansible_facts=dict(variables["ansible_facts"], systemd={"version": 252}))
    text = render_template_file("roles/inference_service/templates/inference.service.j2", **variables)
    conf = render_template_file("roles/inference_service/templates/instance.conf.j2", __instance=instances[1],
                                **variables) if template else ""
    return unit, text.splitlines(), conf.splitlines()


@pytest.mark.parametrize("engine", sorted(engines.ENGINES))
@pytest.mark.parametrize("layout", ["single", "per_node"])
def test_the_unit_carries_what_the_adapter_returns(engine, layout):
    unit, lines, conf = service_unit(engine, layout)
    assert [line for line in lines if line.startswith("ExecStart=")] == ["ExecStart=" + unit["exec_start"]]
    assert all("Environment=" + env in lines for env in unit["environment"])
    assert all(line in lines for line in unit["sandbox"] + ["# " + line for line in unit["comment"]])
    # The sandbox's own lines stay for every engine.
    assert "SystemCallFilter=sched_setaffinity" in lines and "IPAddressDeny=any" in lines
    if layout == "per_node":
        assert "Environment=LLMTUNE_PORT=8001" in conf
        assert all("Environment=" + env in conf for env in unit["instance_environment"]["llm-inference@1.service"])


@pytest.mark.parametrize("parallel, slots", [(4, 2), (3, 2), (1, 1)])
def test_the_hosts_slots_are_split_between_its_engines_rounded_up(parallel, slots):
    """nginx admits inference_service_parallel for the host: each of the two engines gets its share, at least one."""
    unit, _, _ = service_unit("llama_cpp", "per_node", inference_service_parallel=parallel)
    assert f" --parallel {slots} --ctx-size {4096 * slots} " in unit["exec_start"]


def test_the_engines_an_operator_may_choose_are_the_adapters():
    spec = load("roles/inference_service/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(spec["inference_service_engine"]["choices"]) == sorted(engines.ENGINES)
    spec = load("roles/autotune/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(spec["autotune_engines"]["choices"]) == sorted(engines.ENGINES)


def test_the_benchmark_knows_every_engine_and_sends_each_its_own_fixed_length_fields():
    """inference_benchmark's server option lists the adapters, and a fixed output length is asked for in each
    engine's own request field (transformers serve refuses unknown fields with HTTP 422)."""
    options = yaml.safe_load(inference_benchmark.DOCUMENTATION)["options"]
    assert options["server"]["choices"] == sorted(engines.ENGINES)
    params = {"max_tokens": 32, "include_usage": False, "ignore_eos": True}
    bodies = {name: inference_benchmark.request_body("m", "p", dict(params, server=name)) for name in engines.ENGINES}
    assert bodies["llama_cpp"]["ignore_eos"] is True and bodies["vllm"]["ignore_eos"] is True
    assert "ignore_eos" not in bodies["transformers"]
    assert json.loads(bodies["transformers"]["generation_config"]) == {"min_new_tokens": 32, "max_new_tokens": 32}
