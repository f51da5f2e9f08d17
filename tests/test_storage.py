"""Where checkpoints live (``workers/storage.py``): a path and an ``s3://`` URL the same way,
through fsspec and ``torch.distributed.checkpoint``, against moto's S3 server on loopback; and
``up --storage``'s check. On several hosts: tests/lab/test_ssh_cluster.py."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed.checkpoint as dcp

import gpugeek_jupyter as gg
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.kernel import environment
from gpugeek_jupyter.workers import storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def s3(monkeypatch):
    """An S3 server of the test's own on 127.0.0.1, bucket ``ckpt``; the standard AWS variables
    point at it, as a configured machine's do."""
    boto3 = pytest.importorskip("boto3")
    server_module = pytest.importorskip("moto.server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3").create_bucket(Bucket="ckpt")
    try:
        yield "s3://ckpt"
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["path", "s3"])
def test_a_checkpoint_saves_and_loads_the_same_way_on_a_path_and_on_s3(kind, tmp_path, request):
    where = str(tmp_path / "ckpt") if kind == "path" else request.getfixturevalue("s3") + "/run"
    place = storage.Place(where)
    assert place.latest() is None
    model = torch.nn.Linear(8, 2)
    for step in (5, 10):
        path = place.step(step)
        dcp.save({"model": model.state_dict()}, checkpoint_id=path, no_dist=True)
        place.save_extra(path, 0, {"step": step})
        if step == 5:
            place.complete(path, step)
    assert place.latest() == f"{where}/step-00000005", "a checkpoint without COMPLETE was taken"
    place.complete(place.step(10), 10)
    assert place.latest() == f"{where}/step-00000010"
    state = {"model": torch.nn.Linear(8, 2).state_dict()}
    dcp.load(state, checkpoint_id=place.latest(), no_dist=True)
    assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
    assert place.load_extra(place.latest(), 0) == {"step": 10}
    storage.check_shared(place, 0)          # one process: nothing to check


def test_a_url_whose_file_system_this_host_lacks_is_one_line():
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed here")
    except ImportError:
        pass
    with pytest.raises(GpugeekError) as failed:
        storage.Place("gs://bucket/run")
    assert str(failed.value) == ("checkpoint dir gs://bucket/run: this host cannot open gs:// (no gcsfs) — "
                                 "`up --storage gs://…` installs it on the hosts")


def test_up_storage_takes_object_storage_urls_and_shared_paths_only():
    assert environment.storage_url("s3://bucket/prefix/") == "s3://bucket/prefix"
    assert environment.storage_url("/mnt/shared/runs") == "/mnt/shared/runs"
    assert environment.storage_packages("s3://bucket/x")[0].startswith("s3fs")
    assert environment.storage_packages("/mnt/shared") == []
    for wrong, said in (("ftp://host/x", "give s3://BUCKET/PREFIX"), ("s3://", "give s3://BUCKET/PREFIX"),
                        ("runs/here", "is not an absolute path")):
        with pytest.raises(GpugeekError, match=said):
            environment.storage_url(wrong)


def test_up_storage_that_is_wrong_starts_nothing(gpugeek_home):
    with pytest.raises(GpugeekError, match="--storage ftp://x/y is not a place to keep files — give s3://"):
        gg.up("stored", storage="ftp://x/y")
    assert gg.clusters().empty
