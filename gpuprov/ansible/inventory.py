"""Render a cluster's inventory and ansible.cfg from templates/."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.providers import ClusterFiles
from gpuprov.ssh import node_key
from gpuprov.state import NodeRecord


def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ini_value"] = _ini_value
    return env


def _ini_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return f"'{text}'" if (" " in text or not text) else text


def render(
    cluster: str,
    provider: str,
    nodes: Sequence[NodeRecord],
    expectations: Mapping[str, Mapping[str, Any]],
    files: ClusterFiles,
) -> dict[str, Any]:
    """Write inventory.ini and ansible.cfg into the cluster dir; return the template context."""
    env = _env()
    context = {
        "cluster": cluster,
        "provider": provider,
        "inventory": files.inventory,
        "ansible_cfg": files.ansible_cfg,
        "known_hosts": files.known_hosts,
        "site_playbook": paths.playbooks_dir() / "site.yml",
        "roles_path": paths.roles_dir(),
        # One fork per node up to a sane ceiling: the controller, not the
        # nodes, is the bottleneck past that.
        "forks": max(5, min(len(nodes), 50)),
        "nodes": [
            {
                "name": n.name,
                "address": n.address,
                "ssh_port": n.ssh_port,
                "user": n.user,
                "key_file": node_key(n, files.key),
                "instance_type": n.instance_type,
                "expected_gpus": expectations.get(n.name, {}).get("gpus"),
            }
            for n in nodes
        ],
    }
    context["group_vars"] = group_vars(context)
    _write(files.inventory, env.get_template("inventory.ini.j2").render(context))
    _write(files.ansible_cfg, env.get_template("ansible.cfg.j2").render(context))
    return context


def group_vars(context: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "ansible_become": True,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={context['known_hosts']} -o StrictHostKeyChecking=yes "
            "-o IdentitiesOnly=yes"
        ),
        "gpuprov_cluster": context["cluster"],
        "gpuprov_provider": context["provider"],
    }


def to_json(context: Mapping[str, Any]) -> dict[str, Any]:
    """The same inventory in Ansible's JSON inventory form (`ansible-inventory --list`)."""
    common = context.get("group_vars") or group_vars(context)
    hostvars = {
        n["name"]: {
            "ansible_host": n["address"],
            "ansible_port": n["ssh_port"],
            "ansible_user": n["user"],
            **({"ansible_ssh_private_key_file": str(n["key_file"])} if n["key_file"] else {}),
            "gpuprov_instance_type": n["instance_type"] or "unknown",
            "gpuprov_expected_gpus": "" if n["expected_gpus"] is None else n["expected_gpus"],
            **common,
        }
        for n in context["nodes"]
    }
    return {
        "all": {"children": ["gpuprov_nodes", "ungrouped"]},
        "gpuprov_nodes": {"hosts": list(hostvars)},
        "_meta": {"hostvars": hostvars},
    }


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)
