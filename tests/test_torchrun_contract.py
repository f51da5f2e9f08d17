"""The variables ``torchrun`` sets, as every worker gets them (``launch/torchrun.py``): pure
functions, held against what ``torchrun --nnodes 2 --nproc-per-node 2`` would set."""

from __future__ import annotations

from gpugeek_jupyter.launch import torchrun


def test_a_nodes_ranks_are_consecutive_and_rank_0_keeps_the_first_bundle():
    assert torchrun.rank_order(["a", "b", "a", "b"]) == [0, 2, 1, 3]
    assert torchrun.rank_order(["b", "a", "a"]) == [0, 1, 2]
    assert torchrun.rank_order(["a"]) == [0]


def test_two_nodes_of_two_gpus_get_torchruns_variables_and_see_their_nodes_gpus_by_local_rank():
    where = [("a", [3]), ("a", [1]), ("b", [0]), ("b", [1])]
    envs = torchrun.contract(where, "10.0.0.1", 29500, "g1")
    picked = [{k: e[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                                 "GROUP_WORLD_SIZE", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES")} for e in envs]
    assert picked == [
        {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "NODE_RANK": "0",
         "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "3,1"},
        {"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "NODE_RANK": "0",
         "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "3,1"},
        {"RANK": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "NODE_RANK": "1",
         "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "0,1"},
        {"RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "NODE_RANK": "1",
         "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "0,1"},
    ]
    # each worker's GPU is cuda:LOCAL_RANK of what it sees: its own Ray-given GPU
    for (_, own), env in zip(where, envs, strict=True):
        assert env["CUDA_VISIBLE_DEVICES"].split(",")[torchrun.device_index(env)] == str(own[0])
    assert {e["MASTER_ADDR"] for e in envs} == {"10.0.0.1"} and {e["MASTER_PORT"] for e in envs} == {"29500"}
    assert {e["TORCHELASTIC_RUN_ID"] for e in envs} == {"gpugeek-g1"}      # what Lightning looks for
    assert {e["TORCHELASTIC_USE_AGENT_STORE"] for e in envs} == {"False"}  # rank 0 hosts the store


def test_shared_or_several_gpus_per_worker_and_cpu_workers_keep_rays_devices():
    shared = torchrun.contract([("a", [0]), ("a", [0])], "h", 1, "g")       # --gpus-per-worker 0.5
    several = torchrun.contract([("a", [0, 1])], "h", 1, "g")
    cpus = torchrun.contract([("a", []), ("b", [])], "h", 1, "g")
    assert not any("CUDA_VISIBLE_DEVICES" in e for e in shared + several + cpus)
    assert [torchrun.device_index(e) for e in shared] == [0, 0]
    assert [(e["LOCAL_RANK"], e["GROUP_RANK"]) for e in cpus] == [("0", "0"), ("0", "1")]
