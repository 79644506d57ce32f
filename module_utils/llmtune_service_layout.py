# -*- coding: utf-8 -*-
"""The inference service's engines: one, or one per NUMA node (inference_service_layout per_node), each with its
systemd unit, port, CPUs, threads, memory binding and slots; where clients and nginx reach them; the ports of their
direct-run twins. Decided here once per deploy (module engine_adapter) and read by the role's tasks and templates."""

from __future__ import annotations

import json
import re

from ansible.module_utils.parsing.convert_bool import boolean

LOOPBACK = re.compile(r"^(127\.[0-9.]+|::1|localhost)$")

# The role variables a layout is decided from (module engine_adapter's option `layout`), without their prefix.
INPUTS = ("name", "listen", "port", "proxy_port", "layout", "tuned", "parallel", "cpu_affinity", "threads",
          "numa_policy", "numa_mask", "firewall_ports")


class LayoutError(ValueError):
    """A variable outside its rule: the message names it, its rule and its value, as the role's checks do."""

    def __init__(self, name, rule, value):
        super().__init__(f"{name} must be {rule} (got {json.dumps(value)})")


def _int(v, key, rule):
    """V[KEY] as an int, or a LayoutError naming the role variable (a value no argument spec checked: tasks_from
    unit or verify)."""
    try:
        return int(v[key])
    except (TypeError, ValueError):
        raise LayoutError("inference_service_" + key, rule, v[key]) from None


def engines(v, topology):
    """The engines of the layout: per_node puts one on each NUMA node with usable cores (cpu_topology's
    recommended.per_node) where there are two or more, and splits the host's slots evenly between them, rounded up
    (nginx admits inference_service_max_concurrent requests for all of them, so a KV cache of every slot on each
    would sit unused). Memory is bound per node only where set_mempolicy(2) is allowed (numa_policy_permitted)."""
    nodes = ((topology or {}).get("recommended") or {}).get("per_node") or []
    parallel = _int(v, "parallel", ">= 1")
    if v["layout"] == "per_node" and boolean(v["tuned"], strict=False) and len(nodes) > 1:
        bind = (topology or {}).get("numa_policy_permitted") is True
        count = len(nodes)
        return [{"unit": f"{v['name']}@{node['numa_node']}.service", "node": node["numa_node"],
                 "port": _int(v, "port", "1-65535") + index, "cpus": " ".join(str(cpu) for cpu in node["cpus"]),
                 "threads": node["threads"], "numa_policy": "bind" if bind else "",
                 "numa_mask": " ".join(str(m) for m in node["memory_nodes"]) if bind else "",
                 "slots": (parallel + count - 1) // count}
                for index, node in enumerate(nodes)]
    return [{"unit": f"{v['name']}.service", "node": None, "port": _int(v, "port", "1-65535"),
             "cpus": v["cpu_affinity"], "threads": _int(v, "threads", ">= 0 (0: the topology's recommendation)"),
             "numa_policy": v["numa_policy"], "numa_mask": v["numa_mask"], "slots": parallel}]


def layout(v, topology=None):
    """Everything the role reads of the engines' layout, from the role's variables V (INPUTS) and the cpu_topology
    facts; raises LayoutError for ports that collide or run past 65535."""
    instances = engines(v, topology)
    ports = [instance["port"] for instance in instances]
    per_node = instances[0]["node"] is not None
    loopback = bool(LOOPBACK.match(str(v["listen"])))
    # Behind nginx (at a non-loopback address, with the key, or in front of several engines, so that clients have
    # one endpoint) the engine only listens on loopback.
    proxied = not loopback or per_node
    host = v["listen"] if loopback else "127.0.0.1"
    base = "http://" + (f"[{host}]" if ":" in host else host)
    # Each firewall port and the next ones, one per engine: each engine's direct-run twin.
    try:
        twins = [int(port) + index for port in v["firewall_ports"] for index in range(len(instances))]
    except (TypeError, ValueError):
        raise LayoutError("inference_service_engine_firewall_ports", "a list of ports 1-65535",
                          v["firewall_ports"]) from None
    if not 1 <= _int(v, "port", "1-65535") <= 65535:
        raise LayoutError("inference_service_port", "1-65535", v["port"])
    if max(ports) > 65535:
        raise LayoutError("inference_service_port", "low enough for one more port per engine (one engine per NUMA "
                          "node with per_node), up to 65535", v["port"])
    proxy_port = _int(v, "proxy_port", "1-65535")
    if not 1 <= proxy_port <= 65535 or proxy_port in ports:
        raise LayoutError("inference_service_proxy_port", "1-65535, other than the engines' ports "
                          "(inference_service_port, and one more per NUMA node with per_node)", v["proxy_port"])
    if set(twins) & set(ports):
        raise LayoutError("inference_service_engine_firewall_ports", "other than the engines' ports "
                          "(inference_service_port, and one more per NUMA node with per_node), each with as many "
                          "ports after it (one twin per engine)", v["firewall_ports"])
    return {
        "instances": instances,
        "units": [instance["unit"] for instance in instances],
        "per_node": per_node,
        "loopback": loopback,
        "proxied": proxied,
        "engine_host": host,
        "engine_base": base,
        # Every engine's base URL, in the order of the instances: nginx's backends, the benchmark's engines.
        "engine_urls": [f"{base}:{port}" for port in ports],
        # The template unit's file for per_node; each instance's settings are in its drop-in.
        "unit_file": f"/etc/systemd/system/{v['name']}{'@' if per_node else ''}.service",
        "twin_ports": twins,
        "access_ports": list(dict.fromkeys(ports + twins)),
    }
