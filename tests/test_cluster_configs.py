"""Cloud launcher YAML and KubeRay manifests from offers, and bad input — no cluster started."""

from __future__ import annotations

import copy

import pytest
import yaml

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import launcher
from gpugeek_jupyter.errors import GpugeekError


@pytest.mark.parametrize("backend, gpu, count, pricing", [
    ("aws", "A100", 8, "spot"),
    ("gcp", "T4", 1, "spot"),          # an n1 host with an attached GPU
    ("gcp", "H100", 8, "on-demand"),
    ("azure", "A100", 8, "on-demand"),
])
def test_launcher_yaml_passes_rays_validation(backend, gpu, count, pricing):
    shown = gg.up(backend=backend, gpu=gpu, count=count, workers=2, max_workers=4, pricing=pricing)
    assert isinstance(shown, gg.LaunchConfig), "without --yes a cloud is shown, not launched"
    config = yaml.safe_load(shown.path.read_text())
    assert config == shown.config
    launcher.validate(config)                     # Ray's own defaults + JSON schema
    worker = next(v for k, v in config["available_node_types"].items() if k != "head")
    offer = gg.offers(gpu=gpu, count=count, provider=backend, pricing=pricing).iloc[0]
    assert worker["min_workers"] == 2 and worker["max_workers"] == 4
    assert worker["resources"]["GPU"] == count
    node = worker["node_config"]
    instance = {"aws": node.get("InstanceType"), "gcp": node.get("machineType"),
                "azure": node.get("azure_arm_parameters", {}).get("vmSize")}[backend]
    assert instance == offer["instance_type"]
    if pricing == "spot":
        assert {"aws": node.get("InstanceMarketOptions", {}).get("MarketType"),
                "gcp": node.get("scheduling", {}).get("provisioningModel")}[backend] in ("spot", "SPOT")
    if backend == "gcp" and gpu == "T4":
        assert node["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]
    assert "not priced" in shown.next_step, "the unpriced CPU head is said, not hidden"
    assert not gg.clusters()["name"].tolist(), "showing a config records no cluster"


def test_broken_launcher_config_is_rejected_by_ray():
    shown = gg.up(backend="aws", gpu="A100", count=8)
    broken = copy.deepcopy(shown.config)
    broken["max_workers"] = "x"
    with pytest.raises(GpugeekError, match="Ray rejects the generated aws config: 'x' is not of type 'integer'"):
        launcher.validate(broken)


def test_spot_fallback_adds_an_on_demand_node_type():
    shown = gg.up(backend="aws", gpu="H100", count=8, pricing="spot", spot_fallback=True, workers=2)
    types = shown.config["available_node_types"]
    assert set(types) == {"head", "h100x8-spot", "h100x8-on-demand"}
    assert types["h100x8-spot"]["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"}
    assert "InstanceMarketOptions" not in types["h100x8-on-demand"]["node_config"]
    assert types["h100x8-on-demand"]["min_workers"] == 0


def test_kuberay_manifest_has_gpu_limits_per_group():
    shown = gg.up(backend="kuberay", gpu="A100", count=8, workers=2, max_workers=3, pricing="spot",
                  spot_fallback=True)
    manifest = yaml.safe_load(shown.path.read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"
    assert manifest["spec"]["enableInTreeAutoscaling"] is True
    groups = {g["groupName"]: g for g in manifest["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"a100x8-spot", "a100x8-on-demand"}
    spot = groups["a100x8-spot"]
    assert (spot["minReplicas"], spot["replicas"], spot["maxReplicas"]) == (2, 2, 3)
    container = spot["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
    offer = gg.offers(gpu="A100", count=8, pricing="spot").iloc[0]
    assert spot["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == offer["instance_type"]
    head = manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"]["limits"]


def test_dry_run_of_sim_shows_fake_multinode_config():
    shown = gg.up(backend="sim", gpu="A100", count=8, workers=2, dry_run=True)
    types = shown.config["available_node_types"]
    assert types["a100x8-on-demand"]["resources"]["GPU"] == 8
    assert types["a100x8-on-demand"]["resources"]["accelerator_type:A100"] == 1
    assert shown.config["provider"]["type"] == "fake_multinode"
    assert "CPUs scaled to fit this machine" in shown.next_step


def _one_line(ipython, capsys, line):
    result = ipython.run_cell(f"%gpugeek {line}")
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert result.error_in_exec is not None or "UsageError" in text
    lines = text.splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize("line, expected", [
    ("up --backend moon", "unknown backend 'moon' — use one of local, sim, ssh, aws, gcp, azure, kuberay"),
    ("up --backend sim --offer aws/p5.48xlarge/us-east-9",
     "no offer with id 'aws/p5.48xlarge/us-east-9' — did you mean"),
    ("up --backend sim --gpu A100 --count 8 --workers 0", "--workers 0: must be at least 1"),
    ("up --backend sim --gpu A100 --count 8 --budget -5", "--budget -5.0: must be a positive number"),
    ("up --backend sim --gpu A100 --count 8 --budget lots", "--budget 'lots' is not a number"),
    ("up --backend sim --gpu A100 --count 8 --idle 0", "--idle 0.0: must be a positive number"),
    ("up --backend aws --offer gcp/a2-highgpu-8g/asia-northeast1/asia-northeast1-a",
     "is a gcp offer — the aws backend needs a aws offer"),
    ("up --backend local --gpu A100", "--gpu: the local backend runs on this machine"),
    ("up --backend sim --gpu A100 --count 8 --pricing spot --spot-fallback --max-workers 1 --workers 2",
     "--max-workers 1 is below the 2 worker nodes asked for"),
    ("up --backend sim --gpu A100 --spot-fallback", "--spot-fallback only makes sense with --pricing spot"),
    ("up --backend sim", "say what to run on: --offer ID, --plan VAR or --gpu NAME"),
    ("up --backend sim --plan nothing_here", "no variable 'nothing_here'"),
    ("up bad/name", "cluster name 'bad/name'"),
    ("up --backend ssh --usd-per-hour 1", "--hosts: name the machines"),
    ("up --backend ssh --hosts a@@b --usd-per-hour 1", "--hosts 'a@@b': write each host as [USER@]HOST[:PORT]"),
    ("up --backend ssh --hosts h1,h1 --usd-per-hour 1", "--hosts: a host is named twice"),
    ("up --backend ssh --hosts h1,h2", "say what each host costs: --usd-per-hour X"),
    ("up --backend ssh --hosts h1 --usd-per-hour -1", "--usd-per-hour -1.0: give a number of dollars"),
    ("up --backend ssh --hosts h1 --usd-per-hour 1 --workers 2", "--workers: an ssh cluster is the --hosts"),
    ("up --backend sim --gpu A100 --hosts h1", "--hosts: only for --backend ssh"),
    ("up --backend ssh --hosts 127.0.0.1:1 --usd-per-hour 0", "127.0.0.1:1: SSH failed"),
    ("status nosuch", "no cluster named 'nosuch'"),
    ("down nosuch", "no cluster named 'nosuch'"),
    ("cost nosuch", "no cluster named 'nosuch'"),
    ("preempt abc nosuch", "no cluster named 'nosuch'"),
    ("scale 0 nosuch", "workers 0: must be at least 1"),
    ("up --address nohost", "--address 'nohost': give host:port"),
    ("up --address 127.0.0.1:1", "nothing answers at 127.0.0.1:1"),
    ("up --backend kuberay --gpu A100 --count 8 --budget 5 --yes", "not enforced on KubeRay yet"),
    ("up --backend sim --gpu A100 --count 8 --budget inf", "--budget inf: must be a positive number"),
])
def test_bad_input_is_one_line(ipython, capsys, line, expected):
    assert expected in _one_line(ipython, capsys, line)


def test_launch_without_credentials_is_one_line(ipython, capsys, tmp_path, monkeypatch):
    for var in (*launcher.AWS_ENV, "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CLIENT_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))           # no ~/.aws, ~/.config/gcloud, ~/.azure
    monkeypatch.setenv("PATH", "/nonexistent")          # no kubectl
    expected = {"aws": "no AWS credentials found", "gcp": "no Google Cloud credentials found",
                "azure": "no Azure credentials found"}
    for backend, message in expected.items():
        assert message in _one_line(ipython, capsys, f"up --backend {backend} --gpu A100 --count 8 --yes")
    assert "kubectl is not on PATH" in _one_line(ipython, capsys, "up --backend kuberay --gpu A100 --count 8 --yes")
    # credentials present but the SDK `ray up` needs is not: also one line, naming the package
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    monkeypatch.setattr(launcher, "_importable", lambda module: False)
    assert "needs the aws SDK — pip install boto3" in _one_line(
        ipython, capsys, "up --backend aws --gpu A100 --count 8 --yes")
    assert gg.clusters().empty, "a launch refused up front records nothing"
