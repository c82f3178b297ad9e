"""The reward-model worker loads lean on 2 gloo ranks (hyflow/workers/lean_load.py): each rank builds the sequence
classifier on meta, shards it with FSDP2 and reads only its rows of the checkpoint (the `score` head's one row
included), and ends with exactly the shards, buffers and scores of the full load (`from_pretrained` on every rank,
then FSDP2), in fp32 and in bf16 with offload, scoring a batch exactly as the one-rank worker does; a folder of
`pytorch_model.bin` falls back to rank 0 loading and broadcasting, with the same scores. The same on 2 GPUs over
NCCL where there are two."""

import os

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForSequenceClassification

from hyflow.config.common import FSDPConfig
from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup
from hyflow.models.loader import DTYPE_KWARG
from hyflow.protocol import DataProto
from hyflow.workers.fsdp import DTYPES, apply_fsdp2, build_device_mesh
from hyflow.workers.reward_model import RewardModelWorker

from .distributed import run_ranks
from .reward_models import conversation_batch, reward_model_config, save_reward_model_folders
from .test_lean_load import folder_without_safetensors, shards_and_buffers

CASES = {  # case -> (folder, reward_model.model.fsdp_config)
    "fp32": ("rm", FSDPConfig()),
    "bf16_offload": ("rm", FSDPConfig(model_dtype="bf16", param_offload=True)),
    "bin": ("bin", FSDPConfig()),
}


def config_of(paths: dict, case: str):
    folder, fsdp_config = CASES[case]
    config = reward_model_config(paths[folder], paths["policy"], micro_batch_size_per_gpu=2)
    config.model.fsdp_config = fsdp_config
    return config


def full_load(config, pad_token_id: int):
    """The reward model as the worker loaded it before lean loading: `from_pretrained` on every rank, then FSDP2."""
    dtype = DTYPES[config.model.fsdp_config.model_dtype]
    model = AutoModelForSequenceClassification.from_pretrained(config.model.path, **{DTYPE_KWARG: dtype})
    model.config.pad_token_id = pad_token_id
    return apply_fsdp2(model.eval(), config.model.fsdp_config, build_device_mesh())


def every_case(rank: int, paths: dict, data: DataProto) -> dict:
    """Per case: the lean worker's load stats, shards, buffers and scores of this rank's half of `data`, and the
    full load's shards, buffers and scores (the same scorer on the full load's model); all on the CPU."""
    results = {}
    for case in CASES:
        config = config_of(paths, case)
        worker = RewardModelWorker(config)
        worker.init_model()
        model = worker.scorer.model
        meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
        lean = {"stats": worker.scorer.load_stats, "tensors": on_cpu(shards_and_buffers(model)), "meta": meta}
        lean["rm_scores"] = worker.compute_rm_score(data.chunk(2)[rank]).batch["rm_scores"]
        worker.scorer.model = full_load(config, worker.scorer.tokenizer.pad_token_id)
        full = {"tensors": on_cpu(shards_and_buffers(worker.scorer.model))}
        full["rm_scores"] = worker.compute_rm_score(data.chunk(2)[rank]).batch["rm_scores"]
        results[case] = {"lean": lean, "full": full}
    return results


def on_cpu(tensors: tuple[dict, dict]) -> tuple[dict, dict]:
    return tuple({name: tensor.cpu() for name, tensor in group.items()} for group in tensors)


def assert_lean_is_the_full_load(result: dict, case: str) -> None:
    """Bitwise: the same parameter shards (in the configured dtype), buffers and scores; nothing left on meta."""
    lean, full = result["lean"], result["full"]
    assert lean["meta"] == []
    for kind in (0, 1):  # parameters, buffers
        assert lean["tensors"][kind].keys() == full["tensors"][kind].keys()
        for name, expected in full["tensors"][kind].items():
            assert lean["tensors"][kind][name].dtype == expected.dtype, name
            assert torch.equal(lean["tensors"][kind][name], expected), name
    assert {p.dtype for p in lean["tensors"][0].values()} == {DTYPES[CASES[case][1].model_dtype]}
    assert torch.equal(lean["rm_scores"], full["rm_scores"])


def one_rank_scores(config, data: DataProto) -> torch.Tensor:
    """`rm_scores` of the one-rank worker (a local group, no process group), on one thread as each rank runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks run on one thread each (distributed.py): the same float sums
    try:
        group = LocalWorkerGroup(ClassWithInitArgs(RewardModelWorker, config=config))
        group.init_model()
        return group.compute_rm_score(data).batch["rm_scores"]
    finally:
        torch.set_num_threads(threads)


def folders_and_batch(root) -> tuple[dict, DataProto]:
    folders = save_reward_model_folders(root)
    paths = {
        "rm": folders["rm"],
        "policy": folders["policy"],
        "bin": folder_without_safetensors(folders["rm"], str(root / "bin")),
    }
    return paths, conversation_batch(folders["policy_tokenizer"])


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    paths, data = folders_and_batch(tmp_path_factory.mktemp("rm_lean"))
    return paths, data, run_ranks(every_case, 2, paths, data, timeout_s=300)


@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(CASES))
def test_the_lean_reward_model_has_every_shard_buffer_and_score_of_the_full_load_bitwise(setting, case):
    _, _, results = setting
    for rank_results in results:
        assert_lean_is_the_full_load(rank_results[case], case)
    shards = [rank_results[case]["lean"]["tensors"][0]["score.weight"].shape for rank_results in results]
    assert shards == [(1, 32), (0, 32)]  # the head's one row, on rank 0: FSDP2 shards it with the root
    assert any(name.endswith("inv_freq") for name in results[0][case]["lean"]["tensors"][1])


@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(CASES))
def test_two_lean_ranks_score_the_batch_exactly_as_the_one_rank_worker(setting, case):
    paths, data, results = setting
    two_ranks = torch.cat([rank_results[case]["lean"]["rm_scores"] for rank_results in results])
    expected = one_rank_scores(config_of(paths, case), data)
    assert torch.count_nonzero(expected) == len(data)  # one score per row, on its last response token
    assert torch.equal(two_ranks, expected)


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_a_safetensors_reward_model_is_sliced_and_a_bin_folder_broadcasts_from_rank_0(setting):
    _, _, results = setting
    for rank_results in results:
        stats = {case: rank_results[case]["lean"]["stats"] for case in CASES}
        assert [stats[case].mode for case in CASES] == ["sliced", "sliced", "broadcast"]
        assert "no *.safetensors" in stats["bin"].reason
        assert stats["bin"].bytes_read == 0


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_each_lean_rank_reads_about_half_of_the_reward_models_bytes(setting):
    paths, _, results = setting
    with safe_open(os.path.join(paths["rm"], "model.safetensors"), framework="pt") as handle:
        tensors = [handle.get_tensor(key) for key in handle.keys()]  # noqa: SIM118 (not a dict)
    sizes = [tensor.numel() * tensor.element_size() for tensor in tensors]
    total, largest = sum(sizes), max(sizes)
    for case in ("fp32", "bf16_offload"):
        reads = [rank_results[case]["lean"]["stats"] for rank_results in results]
        assert sum(stats.bytes_read for stats in reads) == total  # every byte read once, by exactly one rank
        for stats in reads:
            assert stats.bytes_read <= total / 2 + largest
            assert stats.largest_read <= largest / 2 + largest / 16  # a shard: half the rows (plus rounding)


@pytest.mark.gpu
@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_on_two_gpus_over_nccl_the_lean_reward_model_is_the_full_load(tmp_path):
    paths, data = folders_and_batch(tmp_path)
    results = run_ranks(every_case, 2, paths, data, timeout_s=300, backend="nccl")
    for rank_results in results:
        assert [rank_results[case]["lean"]["stats"].mode for case in CASES] == ["sliced", "sliced", "broadcast"]
        for case in CASES:
            assert_lean_is_the_full_load(rank_results[case], case)
