"""What of Ray's insides this package leans on, held against the Ray installed: a release that
moves one fails here, by name, rather than quietly in a cluster. Each is used from one module,
``raynodes.py`` (a test below reads every import of the package for it)."""

from __future__ import annotations

import inspect
import time

import pytest


def test_a_head_can_start_without_ray_client_server():
    """``onhost/script.py``'s ``HEAD_START``: ``ray start`` asks ``get_ray_client_dependency_error``
    whether to start the client server, by that name in ``ray.scripts.scripts``."""
    import ray.scripts.scripts as cli

    assert hasattr(cli, "get_ray_client_dependency_error"), \
        "ray.scripts.scripts.get_ray_client_dependency_error moved: heads would run a Ray Client server"
    assert "get_ray_client_dependency_error()" in inspect.getsource(cli.start.callback), \
        "ray start no longer asks get_ray_client_dependency_error whether to start the client server"


@pytest.mark.parametrize("where, name", [("ray._private.runtime_env.py_modules", "upload_py_modules_if_needed"),
                                         ("ray._private.runtime_env.working_dir", "upload_working_dir_if_needed")])
def test_a_keeper_can_upload_what_a_group_runs_with(where, name):
    """``raynodes.upload_folders`` (``keeper/shipped.py: uploaded``): the folders a group's actors
    take as URIs, uploaded as Ray's own driver does at ``ray.init``."""
    import importlib

    module = importlib.import_module(where)
    assert hasattr(module, name), f"{where}.{name} moved: a keeper cannot send shipped modules to its groups"
    wanted = {"runtime_env", "include_gitignore", "scratch_dir"}
    have = set(inspect.signature(getattr(module, name)).parameters)
    assert wanted <= have, f"{where}.{name} takes {sorted(have)}, no longer {sorted(wanted - have)}"


def test_rays_own_lines_can_be_kept_out_of_cells():
    """``raynodes.wrap_driver_printer`` (``kernel/raylines.py``): a driver's log thread and its
    error listener print through ``ray._private.worker.print_to_stdstream(data, ignore_prefix)``,
    the listener finding it by that module-level name at each call (so the wrapper installed
    before ``ray.init`` sees both)."""
    from ray._private import worker

    assert hasattr(worker, "print_to_stdstream"), "ray._private.worker.print_to_stdstream moved: Ray's lines in cells"
    assert list(inspect.signature(worker.print_to_stdstream).parameters) == ["data", "ignore_prefix"], \
        "ray._private.worker.print_to_stdstream takes other arguments now"
    assert "print_to_stdstream(" in inspect.getsource(worker.listen_error_messages), \
        "ray._private.worker.listen_error_messages no longer prints through print_to_stdstream"
    assert '"pid": "raylet"' in inspect.getsource(worker.listen_error_messages), \
        "Ray's error listener no longer marks its lines pid=raylet: kernel/raylines.py tells them by a name"


def test_the_keepalive_a_head_gives_its_cluster_is_named_as_ray_names_it():
    """``raynodes.LINK_CONFIG`` goes to ``ray start --head --system-config``: each key a RayConfig
    entry (Ray's ``Config`` has a getter per entry; an unknown key ends the GCS at start), and the
    gRPC keepalive Ray's clients read from it (so a stuck connection to a host cut off is redialled)."""
    import ray.scripts.scripts as cli
    from ray._private import grpc_utils
    from ray._raylet import Config

    from gpugeek_jupyter.raynodes import LINK_CONFIG

    assert LINK_CONFIG, "no keepalive for the cluster's connections"
    unknown = [key for key in LINK_CONFIG if not callable(getattr(Config, key, None))]
    assert not unknown, f"Ray's config has no {unknown} now: a head given them would not start"
    assert "system_config" in {p.name for p in cli.start.params}, "ray start takes no --system-config now"
    source = inspect.getsource(grpc_utils)
    assert all(f"ray._config.{key}()" in source for key in LINK_CONFIG), \
        "Ray's Python gRPC channels no longer read the keepalive from its config"


def test_the_wait_for_a_new_machines_ssh_is_bounded_by_the_variable_ray_reads():
    """``raynodes.SSH_WAIT_ENV`` (``launcher.ssh_wait``: ``ray up``'s environment and the head's):
    Ray's launcher reads the wait from it at import, and its updater waits that long for SSH."""
    import os
    import subprocess
    import sys

    from ray.autoscaler._private import updater

    from gpugeek_jupyter.raynodes import SSH_WAIT_ENV

    read = subprocess.run([sys.executable, "-c", "from ray.autoscaler._private import constants as c; "
                           "print(c.AUTOSCALER_NODE_START_WAIT_S)"], env={**os.environ, SSH_WAIT_ENV: "37"},
                          capture_output=True, text=True, check=True).stdout.strip()
    assert read == "37", f"Ray no longer reads {SSH_WAIT_ENV} from the environment (it read {read})"
    assert "AUTOSCALER_NODE_START_WAIT_S" in inspect.getsource(updater.NodeUpdater.do_update), \
        "Ray's updater no longer waits AUTOSCALER_NODE_START_WAIT_S for a machine's SSH"


PRIVATE = ("ray._private", "ray._raylet", "ray.autoscaler._private", "ray.experimental.internal_kv")


def test_rays_insides_are_reached_from_one_module():
    """Every import of the package, read from its source (in functions too): only ``raynodes.py``
    names a private module of Ray."""
    import ast
    from pathlib import Path

    import gpugeek_jupyter

    root = Path(gpugeek_jupyter.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module
                     else [])
            found += [(path.relative_to(root).as_posix(), n) for n in names if n.startswith(PRIVATE)]
    assert found, "the scan found no private import at all: it no longer reads the imports"
    assert {where for where, _ in found} == {"raynodes.py"}, sorted(found)


@pytest.mark.parametrize("where, names", [
    ("ray._private.auto_init_hook", ["enable_auto_connect"]),
    ("ray._private.authentication.authentication_token_setup", ["generate_and_save_token",
                                                                "_get_default_token_path", "AUTH_MODE_ENV_VAR"]),
    ("ray._raylet", ["GcsClient", "AuthenticationTokenLoader", "Config"]),
    ("ray.experimental.internal_kv", ["_internal_kv_get", "_internal_kv_put"]),
    ("ray.autoscaler._private.util", ["prepare_config", "validate_config"]),
])
def test_each_private_name_raynodes_uses_is_where_it_was(where, names):
    import importlib

    module = importlib.import_module(where)
    moved = [n for n in names if not hasattr(module, n)]
    assert not moved, f"{where}: {moved} moved (raynodes.py uses them)"


def test_the_machine_images_rays_launcher_gives_ec2_nodes_are_read_where_ray_keeps_them():
    """``raynodes.ec2_default_images`` reads Ray's table from its source (``EC2_IMAGES``: importing
    it costs seconds): what it reads is what Ray uses."""
    from ray.autoscaler._private.aws import config

    from gpugeek_jupyter import raynodes

    read = raynodes.ec2_default_images()
    assert read is not None, f"{raynodes.EC2_IMAGES} moved: no table of default images read from Ray's source"
    assert read == config.DEFAULT_AMI and "us-east-1" in read


def test_the_gcs_client_answers_what_raynodes_asks():
    """``GcsClient`` hands each call on to its ``InnerGcsClient`` (its ``__getattr__``)."""
    from ray._raylet import GcsClient, InnerGcsClient

    assert "__getattr__" in vars(GcsClient), "ray._raylet.GcsClient no longer hands calls to InnerGcsClient"
    for method in ("get_all_node_info", "get_all_resource_usage", "internal_kv_put", "internal_kv_get",
                   "internal_kv_keys"):
        assert hasattr(InnerGcsClient, method), f"ray._raylet.GcsClient.{method} moved (raynodes.py asks it)"


def test_a_gcs_port_nothing_listens_at_is_unreachable_within_the_timeout_asked():
    """A head just stopped: Ray's client would take ~40 s to say so; each read says it in time."""
    from gpugeek_jupyter import ports
    from gpugeek_jupyter.raynodes import ClusterUnreachable, held_by_placement_groups, kv_all, read_nodes

    address = f"127.0.0.1:{ports.free_port()}"
    for read in (read_nodes, held_by_placement_groups, lambda a, timeout: kv_all(a, "job/", timeout)):
        began = time.monotonic()
        with pytest.raises(ClusterUnreachable, match=rf"the Ray cluster at {address} does not answer \(.+\)"):
            read(address, timeout=2.0)
        took = time.monotonic() - began
        assert took < 4.0, f"{read.__name__} took {took:.1f} s to find nothing at {address}"
