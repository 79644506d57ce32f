"""The service's engines (module_utils/llmtune_service_layout.py): one, or one per NUMA node, from the topology of
real machines (tests/fixtures/topology), their ports, URLs and twins' ports, and the checks of the ports; and the
module engine_adapter, which returns them to the role."""

import os
import shutil

import cpu_topology
import pytest
from conftest import FIXTURES

from ansible.module_utils.llmtune_service_layout import INPUTS, LayoutError, layout
from test_engines import run_module
from test_jinja_expressions import render, service_vars, task
from test_tuning_drift import run as run_drift

# The role's defaults (roles/inference_service/defaults/main.yml) as the role passes them, with the topology's
# recommendation for a host of two CPUs.
DEFAULTS = {"name": "llm-inference", "listen": "127.0.0.1", "port": 8000, "proxy_port": 8080, "layout": "single",
            "tuned": True, "parallel": 4, "cpu_affinity": "0 1", "threads": 2, "numa_policy": "", "numa_mask": "",
            "firewall_ports": [8100]}


def topology(fixture, permitted=True, root=None):
    facts = cpu_topology.gather(root or os.path.join(FIXTURES, "topology", fixture))
    facts["numa_policy_permitted"] = permitted
    return facts


def test_the_inputs_are_the_role_variables_the_role_passes():
    assert set(DEFAULTS) == set(INPUTS)
    passed = task("roles/inference_service/tasks/adapter.yml", "Read the engine's adapter and decide the service's engines")
    assert {key: value.strip("{} ") for key, value in passed["engine_adapter"]["layout"].items()} == {
        key: "inference_service_" + ("engine_" + key if key == "firewall_ports" else key) for key in INPUTS}


@pytest.mark.parametrize("fixture, layout_name, cpus, threads", [
    ("qemu-2node", "single", "0", 1), ("epyc-1socket", "per_node", "0 1 2 3 4 5 6 7", 8),
    ("power9-lpar-memless", "per_node", "0 4", 2)])
def test_one_engine_runs_on_the_topologys_recommendation(fixture, layout_name, cpus, threads):
    """Through the role's defaults (roles/inference_service/defaults/main.yml) as the adapter's task passes them."""
    engines = service_vars(fixture, permitted=True, inference_service_layout=layout_name)["__inference_service_adapter"]
    assert [(i["cpus"], i["threads"], i["slots"]) for i in engines["layout"]["instances"]] == [(cpus, threads, 4)]


@pytest.mark.parametrize("key, value, name", [("port", "eighty", "inference_service_port"),
                                              ("parallel", None, "inference_service_parallel"),
                                              ("firewall_ports", ["x"], "inference_service_engine_firewall_ports")])
def test_a_value_that_is_no_number_is_named(key, value, name):
    with pytest.raises(LayoutError, match=f"^{name} must be "):
        layout(dict(DEFAULTS, **{key: value}), topology("qemu-2node"))


@pytest.mark.parametrize("fixture, layout_name, permitted, expected", [
    # Two sockets, one node each, 2 physical cores per node (SMT siblings left out).
    ("qemu-2node", "per_node", True, [
        {"unit": "llm-inference@0.service", "node": 0, "port": 8000, "cpus": "0", "threads": 1, "numa_policy": "bind",
         "numa_mask": "0", "slots": 2},
        {"unit": "llm-inference@1.service", "node": 1, "port": 8001, "cpus": "1", "threads": 1, "numa_policy": "bind",
         "numa_mask": "1", "slots": 2}]),
    # Where set_mempolicy(2) is refused (container seccomp), pinned to the node's cores, memory unbound.
    ("qemu-2node", "per_node", None, [
        {"unit": "llm-inference@0.service", "node": 0, "port": 8000, "cpus": "0", "threads": 1, "numa_policy": "",
         "numa_mask": "", "slots": 2},
        {"unit": "llm-inference@1.service", "node": 1, "port": 8001, "cpus": "1", "threads": 1, "numa_policy": "",
         "numa_mask": "", "slots": 2}]),
    ("qemu-2node", "single", True, [
        {"unit": "llm-inference.service", "node": None, "port": 8000, "cpus": "0 1", "threads": 2, "numa_policy": "",
         "numa_mask": "", "slots": 4}]),
    # One node: one engine, whatever the layout asks.
    ("epyc-1socket", "per_node", True, [
        {"unit": "llm-inference.service", "node": None, "port": 8000, "cpus": "0 1", "threads": 2,
         "numa_policy": "", "numa_mask": "", "slots": 4}]),
    # Issue 39, input 5: one node with cores (its memory on the CPU-less nodes): one engine, whatever the layout asks.
    ("power9-lpar-memless", "per_node", True, [
        {"unit": "llm-inference.service", "node": None, "port": 8000, "cpus": "0 1", "threads": 2,
         "numa_policy": "", "numa_mask": "", "slots": 4}]),
])
def test_the_engines_of_each_layout(fixture, layout_name, permitted, expected):
    found = layout(dict(DEFAULTS, layout=layout_name), topology(fixture, permitted))
    assert found["instances"] == expected
    assert found["units"] == [engine["unit"] for engine in expected]
    # The engines' ports and one direct-run twin's port per engine from 8100.
    assert found["access_ports"] == [e["port"] for e in expected] + [8100 + i for i in range(len(expected))]
    # Several engines get nginx in front even on loopback (clients need one endpoint), and a template unit.
    assert found["proxied"] is found["per_node"] is (len(expected) > 1)
    assert found["unit_file"] == "/etc/systemd/system/llm-inference" + ("@" if len(expected) > 1 else "") + ".service"
    assert found["engine_urls"] == [f"http://127.0.0.1:{e['port']}" for e in expected]


def test_untuned_is_one_engine_on_every_node():
    found = layout(dict(DEFAULTS, layout="per_node", tuned="False"), topology("qemu-2node"))
    assert found["units"] == ["llm-inference.service"] and not found["proxied"]


@pytest.mark.parametrize("listen, loopback, base", [
    ("127.0.0.1", True, "http://127.0.0.1"), ("127.0.1.1", True, "http://127.0.1.1"), ("::1", True, "http://[::1]"),
    ("localhost", True, "http://localhost"), ("0.0.0.0", False, "http://127.0.0.1"),
    ("127x0.0.1", False, "http://127.0.0.1"), ("10.0.0.5", False, "http://127.0.0.1")])
def test_behind_nginx_the_engine_listens_on_loopback(listen, loopback, base):
    found = layout(dict(DEFAULTS, listen=listen), topology("qemu-2node"))
    assert (found["loopback"], found["proxied"], found["engine_base"]) == (loopback, not loopback, base)


@pytest.mark.parametrize("ports, ok", [([8100], True), ([7999], False), ([8001], False), ([8002], True)])
def test_the_twins_ports_stay_off_the_engines_ports(ports, ok):
    """Two engines (8000, 8001) have two twins from each firewall port: 7999 would put the second twin on 8000."""
    variables = dict(DEFAULTS, layout="per_node", firewall_ports=ports)
    if ok:
        assert layout(variables, topology("qemu-2node"))["twin_ports"] == [ports[0], ports[0] + 1]
    else:
        with pytest.raises(LayoutError, match=r"^inference_service_engine_firewall_ports must be other than the "
                           r"engines' ports .* \(got \[%d\]\)$" % ports[0]):
            layout(variables, topology("qemu-2node"))


@pytest.mark.parametrize("changes, name, alone_ok", [
    ({"port": 65535}, "inference_service_port", True),            # the second engine's port would be 65536
    ({"port": 0}, "inference_service_port", False),
    ({"proxy_port": 8001}, "inference_service_proxy_port", True),  # the second engine's
    ({"proxy_port": 8000}, "inference_service_proxy_port", False),
    ({"proxy_port": 0}, "inference_service_proxy_port", False),
])
def test_ports_past_the_range_or_on_an_engine_are_named(changes, name, alone_ok):
    with pytest.raises(LayoutError, match=f"^{name} must be "):
        layout(dict(DEFAULTS, layout="per_node", **changes), topology("qemu-2node"))
    # One engine: 65535 is a port, 8001 no engine's.
    if alone_ok:
        assert layout(dict(DEFAULTS, **changes), topology("qemu-2node"))["units"] == ["llm-inference.service"]
    else:
        with pytest.raises(LayoutError, match=f"^{name} must be "):
            layout(dict(DEFAULTS, **changes), topology("qemu-2node"))


def test_an_engine_on_a_node_without_usable_memory_binds_the_nearest(tmp_path):
    """A node's memory outside the service's cgroup (system.slice AllowedMemoryNodes=1): its engine binds node 1."""
    root = tmp_path / "xeon-2socket"
    shutil.copytree(os.path.join(FIXTURES, "topology", "xeon-2socket"), root)
    (root / "sys/fs/cgroup/system.slice").mkdir()
    (root / "sys/fs/cgroup/system.slice/cpuset.mems.effective").write_text("1\n")
    found = layout(dict(DEFAULTS, layout="per_node"), topology("xeon-2socket", root=str(root)))
    assert [(i["unit"], i["cpus"], i["numa_mask"]) for i in found["instances"]] == [
        ("llm-inference@0.service", "0 1", "1"), ("llm-inference@1.service", "2 3", "1")]


def test_each_node_of_a_two_socket_xeon_gets_its_own_cores():
    facts = topology("xeon-2socket")
    instances = layout(dict(DEFAULTS, layout="per_node"), facts)["instances"]
    assert [i["node"] for i in instances] == [node["id"] for node in facts["numa_nodes"]]
    for instance, node in zip(instances, facts["numa_nodes"]):
        cpus = [int(cpu) for cpu in instance["cpus"].split()]
        assert set(cpus) <= set(node["cpus"]) and instance["threads"] == len(cpus)
        # One CPU per physical core: no two are SMT siblings.
        assert len({(core["socket"], core["core_id"]) for core in facts["cores"] for cpu in cpus
                    if cpu in core["cpus"]}) == len(cpus)


def test_the_module_returns_the_layout_and_names_a_bad_port(capsys):
    facts = topology("qemu-2node")
    result = run_module({"engine": "llama_cpp", "layout": dict(DEFAULTS, layout="per_node"), "topology": facts,
                         "_ansible_check_mode": True}, capsys)
    assert result["changed"] is False and result["layout"]["units"] == ["llm-inference@0.service",
                                                                         "llm-inference@1.service"]
    result = run_module({"engine": "llama_cpp", "layout": dict(DEFAULTS, layout="per_node", proxy_port=8001),
                         "topology": facts}, capsys)
    assert result["failed"] and result["msg"].startswith("engine_adapter: inference_service_proxy_port must be")
    result = run_module({"engine": "llama_cpp", "layout": {"name": "x"}}, capsys)
    assert result["failed"] and result["msg"].startswith("engine_adapter: layout needs cpu_affinity, firewall_ports")


def test_the_drift_check_gives_each_engine_its_rows(capsys):
    """roles/inference_service/tasks/verify.yml hands tuning_drift what its loops over the engines read."""
    instances = layout(dict(DEFAULTS, layout="per_node"), topology("qemu-2node"))["instances"]
    status = {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}
    service = {"instances": instances,
               "units": [{"__instance": i, "status": status} for i in instances],
               "answers": [{"__instance": instances[0], "status": 200},
                           {"__instance": instances[1], "status": -1, "msg": "Connection refused"}],
               "stale": [{"stdout_lines": []}, {"stdout_lines": ["/opt/llmtune/models/m.gguf"]}]}
    # verify.yml hands on the answers without the requests' headers, which hold the engine key.
    registered = {"results": [dict(a, invocation={"module_args": {"headers": {"Authorization": "Bearer key"}}},
                                   json={"choices": []}) for a in service["answers"]]}
    passed = task("roles/inference_service/tasks/verify.yml", "Compare the service with what it should be")
    assert render(passed["tuning_drift"]["service"]["answers"], __inference_service_verify_answer=registered) == \
        service["answers"]
    result = run_drift({"service": service}, capsys)
    assert [(r["setting"], r["status"]) for r in result["rows"]] == [
        ("inference_service@0.answers", "ok"), ("inference_service@0.started_after_files", "ok"),
        ("inference_service@1.answers", "drift"), ("inference_service@1.started_after_files", "drift"),
        ("inference_service@0.unit", "ok"), ("inference_service@1.unit", "ok")]
    assert result["rows"][2]["actual"] == "HTTP -1 Connection refused"
    assert result["rows"][3]["actual"] == "changed since: /opt/llmtune/models/m.gguf"
    assert result["drift"] == ["inference_service@1.answers", "inference_service@1.started_after_files"]
    # Not deployed: one n/a row naming the engines looked for.
    missing = [{"__instance": i, "status": {"LoadState": "not-found"}} for i in instances]
    result = run_drift({"service": {"instances": instances, "units": missing}}, capsys)
    assert [(r["setting"], r["actual"], r["status"]) for r in result["rows"]] == [
        ("inference_service", "no llm-inference@0.service or llm-inference@1.service", "n/a")]
    # One engine: the rows are inference_service.*.
    single = layout(DEFAULTS, topology("qemu-2node"))["instances"]
    result = run_drift({"service": {"instances": single, "units": [{"__instance": single[0], "status": status}],
                                    "answers": [{"__instance": single[0], "status": 200}],
                                    "stale": [{"stdout_lines": []}]}}, capsys)
    assert [r["setting"] for r in result["rows"]] == ["inference_service.answers",
                                                      "inference_service.started_after_files", "inference_service.unit"]
