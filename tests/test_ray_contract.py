"""What of Ray's insides this package leans on, held against the Ray installed: a release that
moves one fails here, by name, rather than quietly in a cluster. (Each is used from one module.)"""

from __future__ import annotations

import inspect

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
    """``keeper/shipped.py: uploaded``: the folders a group's actors take as URIs, uploaded as Ray's
    own driver does at ``ray.init``."""
    import importlib

    module = importlib.import_module(where)
    assert hasattr(module, name), f"{where}.{name} moved: a keeper cannot send shipped modules to its groups"
    wanted = {"runtime_env", "include_gitignore", "scratch_dir"}
    have = set(inspect.signature(getattr(module, name)).parameters)
    assert wanted <= have, f"{where}.{name} takes {sorted(have)}, no longer {sorted(wanted - have)}"
