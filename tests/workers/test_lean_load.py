"""Lean loading on 2 gloo ranks (hyflow/workers/lean_load.py): each rank builds on meta, shards with FSDP2 and
reads only its rows of the checkpoint, and ends with exactly the shards, buffers, ties and first training step of
the full load (`from_pretrained` on every rank, then FSDP2) — for the actor, the ref (bf16, offloaded), the critic
with a saved value head, a new LoRA actor, one from a saved adapter, a VLM (its checkpoint in the layout transformers
renames on load), a checkpoint of the bare backbone (names without the `model.` prefix that transformers adds on
load) and a folder without safetensors (broadcast from rank 0)."""

import copy
import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.config.common import FSDPConfig, ModelConfig
from hyflow.config.critic import CriticConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.lora import apply_lora
from hyflow.models.value_head import save_value_head
from hyflow.workers import builders
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.critic import DataParallelPPOCritic
from hyflow.workers.fsdp import apply_fsdp2, build_device_mesh
from hyflow.workers.lean_load import _broadcast_reason, build_sharded, slice_plan, with_base_model_prefix
from hyflow.workers.optim import build_optimizer

from .conftest import make_ppo_batch
from .distributed import run_ranks

ROWS = 8


def shards_and_buffers(module):
    """Every parameter's local shard and every buffer, as this rank holds them."""
    params = {n: (p.to_local() if isinstance(p, DTensor) else p).detach().clone() for n, p in module.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    return params, buffers


def tied(lm) -> bool:
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return base.get_output_embeddings().weight is base.get_input_embeddings().weight


def one_step(module, data, critic: bool):
    """The metrics (losses, grad norm) of one update on this rank's half of `data` (the ref's log-probs), and the
    shards after it."""
    shard = data.chunk(2)[dist_rank()]
    if critic:
        config = CriticConfig(ppo_epochs=1, shuffle=False, loss_agg_mode="token-mean", ppo_micro_batch_size_per_gpu=2)
        config.optim.lr = 1e-2
        worker = DataParallelPPOCritic(config, module, build_optimizer(module.parameters(), config.optim), len(shard))
        metrics = worker.update_critic(copy.deepcopy(shard))
    elif not any(p.requires_grad for p in module.parameters()):  # the ref: its log-probs
        log_probs, _ = DataParallelPPOActor(ActorConfig(), module).compute_log_prob(copy.deepcopy(shard))
        return {"log_probs": log_probs.tolist()}, shards_and_buffers(module)[0]
    else:
        config = ActorConfig(ppo_epochs=1, ppo_micro_batch_size_per_gpu=2, use_kl_loss=True, entropy_coeff=0.01)
        config.optim.lr = 1e-2
        worker = DataParallelPPOActor(config, module, build_optimizer(module.parameters(), config.optim), len(shard))
        metrics = worker.update_policy(copy.deepcopy(shard))
    return metrics, shards_and_buffers(module)[0]


def dist_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def lean_and_full(make, fsdp_config, path, data, critic=False):
    """(lean, full) results of one role: stats, shards, buffers, tied, one step's metrics and shards."""
    mesh = build_device_mesh()
    results = []
    for lean in (True, False):
        torch.manual_seed(0)  # LoRA's initialisation draws from it
        if lean:
            module, stats = build_sharded(make, path, fsdp_config, mesh)
        else:
            module, stats = apply_fsdp2(make(False)[0], fsdp_config, mesh), None
        params, buffers = shards_and_buffers(module)
        is_tied = None if critic else tied(module.lm)
        meta = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.device.type == "meta"]
        results.append({
            "stats": stats, "params": params, "buffers": buffers, "tied": is_tied, "meta": meta,
            "step": one_step(module, data, critic),
        })  # fmt: skip
    return results


def every_role(rank: int, paths: dict[str, str], data, image_data):
    actor = ModelConfig(path=paths["model"])
    fsdp, bf16 = FSDPConfig(), FSDPConfig(model_dtype="bf16", param_offload=True)
    critic = CriticConfig().model
    critic.path = paths["critic"]
    lora = ModelConfig(path=paths["model"], lora_rank=4, lora_alpha=8)
    adapter = ModelConfig(path=paths["model"], lora_adapter_path=paths["adapter"])
    return {
        "actor": lean_and_full(builders.policy_maker(actor, fsdp, paths["model"], True), fsdp, paths["model"], data),
        "ref": lean_and_full(builders.policy_maker(actor, bf16, paths["model"], False), bf16, paths["model"], data),
        "critic": lean_and_full(
            builders.value_model_maker(critic, fsdp, paths["critic"]), fsdp, paths["critic"], data, critic=True
        ),
        "lora": lean_and_full(builders.policy_maker(lora, fsdp, paths["model"], True), fsdp, paths["model"], data),
        "adapter": lean_and_full(
            builders.policy_maker(adapter, fsdp, paths["model"], True), fsdp, paths["model"], data
        ),
        "vlm": lean_and_full(
            builders.policy_maker(ModelConfig(path=paths["vlm"]), fsdp, paths["vlm"], True),
            fsdp,
            paths["vlm"],
            image_data,
        ),
        "backbone": lean_and_full(
            builders.policy_maker(ModelConfig(path=paths["backbone"]), fsdp, paths["backbone"], True),
            fsdp,
            paths["backbone"],
            data,
        ),
        "bin": lean_and_full(builders.policy_maker(actor, fsdp, paths["bin"], True), fsdp, paths["bin"], data),
    }


def saved_adapter(model_path: str, folder: str) -> str:
    """A peft adapter for the tiny model with non-zero B (so it changes the outputs), saved to `folder`."""
    torch.manual_seed(1)
    lm = apply_lora(load_causal_lm(model_path), lora_rank=4, lora_alpha=8)
    for name, param in lm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    lm.save_pretrained(folder)
    return folder


def backbone_checkpoint(model_path: str, folder: str) -> str:
    """The tiny model saved from its bare backbone (`Qwen2Model`, as `AutoModel` saves it): tensor names without
    the `model.` prefix, which `from_pretrained` adds for the causal LM (its LM head is tied: nothing is missing)."""
    load_causal_lm(model_path).model.save_pretrained(folder)
    return folder


def folder_without_safetensors(source: str, folder: str) -> str:
    """`source` with its weights saved as `pytorch_model.bin` instead of safetensors."""
    from safetensors.torch import load_file

    shutil.copytree(source, folder)
    state = load_file(os.path.join(folder, "model.safetensors"))
    os.remove(os.path.join(folder, "model.safetensors"))
    torch.save(state, os.path.join(folder, "pytorch_model.bin"))
    return folder


@pytest.fixture(scope="module")
def results(tiny_model_path, vlm_path, image_batch, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lean")
    critic = str(folder / "critic")
    shutil.copytree(tiny_model_path, critic)
    generator = torch.Generator().manual_seed(3)
    save_value_head({"weight": torch.randn(1, 32, generator=generator), "bias": torch.tensor([0.25])}, critic)
    paths = {
        "adapter": saved_adapter(tiny_model_path, str(folder / "adapter")),
        "model": tiny_model_path,
        "vlm": vlm_path,
        "critic": critic,
        "backbone": backbone_checkpoint(tiny_model_path, str(folder / "backbone")),
        "bin": folder_without_safetensors(tiny_model_path, str(folder / "bin")),
    }
    image_data = copy.deepcopy(image_batch)  # the rollout's log-probs stand in for the old and ref ones
    for key in (F.OLD_LOG_PROBS, F.REF_LOG_PROB):
        image_data.batch[key] = image_data.batch[F.ROLLOUT_LOG_PROBS].clone()
    return run_ranks(every_role, 2, paths, make_ppo_batch(batch_size=ROWS, seed=5), image_data, timeout_s=600)


def assert_same(lean, full):
    assert lean["params"].keys() == full["params"].keys()
    for name, expected in full["params"].items():
        assert lean["params"][name].dtype == expected.dtype, name
        assert torch.equal(lean["params"][name], expected), name
    assert lean["buffers"].keys() == full["buffers"].keys()
    for name, expected in full["buffers"].items():
        assert lean["buffers"][name].dtype == expected.dtype, name
        assert torch.equal(lean["buffers"][name], expected), name
    assert lean["meta"] == []
    assert lean["tied"] == full["tied"]


ROLES = ["actor", "ref", "critic", "lora", "adapter", "vlm", "backbone", "bin"]


@pytest.mark.multiproc
@pytest.mark.timeout(900)
@pytest.mark.parametrize("role", ROLES)
def test_lean_loading_gives_every_rank_the_shards_buffers_and_ties_of_the_full_load(results, role):
    for rank_results in results:
        lean, full = rank_results[role]
        assert_same(lean, full)
    if role != "critic":
        assert results[0][role][0]["tied"] is True  # the tiny model ties lm_head to embed_tokens
    assert any(name.endswith("inv_freq") for name in results[0][role][0]["buffers"])


@pytest.mark.multiproc
@pytest.mark.timeout(900)
@pytest.mark.parametrize("role", ROLES)
def test_the_first_training_step_or_ref_log_probs_after_lean_loading_equal_the_full_loads(results, role):
    for rank_results in results:
        (lean_metrics, lean_params), (metrics, params) = rank_results[role][0]["step"], rank_results[role][1]["step"]
        assert lean_metrics == metrics
        assert lean_metrics  # losses and the grad norm were recorded
        for name, expected in params.items():
            assert torch.equal(lean_params[name], expected), name


@pytest.mark.multiproc
@pytest.mark.timeout(900)
def test_safetensors_checkpoints_are_sliced_even_in_layouts_transformers_renames_and_bin_folders_broadcast(results):
    for rank_results in results:
        assert [rank_results[role][0]["stats"].mode for role in ROLES] == ["sliced"] * 7 + ["broadcast"]
    assert "no *.safetensors" in results[0]["bin"][0]["stats"].reason
    assert results[0]["bin"][0]["stats"].bytes_read == 0


@pytest.mark.multiproc
@pytest.mark.timeout(900)
def test_each_rank_reads_about_half_of_the_checkpoint_plus_at_most_one_tensor(results, tiny_model_path):
    with safe_open(os.path.join(tiny_model_path, "model.safetensors"), framework="pt") as handle:
        tensors = [handle.get_tensor(key) for key in handle.keys()]  # noqa: SIM118 (not a dict)
    sizes = [tensor.numel() * tensor.element_size() for tensor in tensors]
    total, largest = sum(sizes), max(sizes)
    reads = [rank_results["actor"][0]["stats"] for rank_results in results]
    assert sum(stats.bytes_read for stats in reads) == total  # every byte read once, by exactly one rank
    for stats in reads:
        assert stats.bytes_read <= total / 2 + largest
        assert stats.largest_read <= largest / 2 + largest / 16  # a shard: half the rows (plus rounding)
        assert stats.tensors_read == len(sizes)


def test_the_base_model_prefix_is_added_or_stripped_only_where_that_names_a_tensor_of_the_model():
    names = {"model.layers.0.mlp.up_proj.weight", "score.weight"}
    assert with_base_model_prefix("layers.0.mlp.up_proj.weight", "model", names) == "model.layers.0.mlp.up_proj.weight"
    assert with_base_model_prefix("score.weight", "model", names) == "score.weight"  # already a name: kept
    assert with_base_model_prefix("model.norm.weight", "model", {"norm.weight"}) == "norm.weight"  # the reverse
    assert with_base_model_prefix("lm_head.weight", "model", names) == "lm_head.weight"  # no name either way


def skeleton_and_plan(path: str):
    module, hf_model = builders.policy_maker(ModelConfig(path=path), FSDPConfig(), path, True)(True)
    return slice_plan(module, hf_model, path)


def test_a_quantised_checkpoint_is_not_sliced_since_a_plain_cast_would_not_dequantise_it(tiny_model_path, tmp_path):
    folder = shutil.copytree(tiny_model_path, tmp_path / "fp8")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(config))
    plan = skeleton_and_plan(str(folder))
    assert plan.missing == []  # every name and shape matches: only the config tells
    assert not plan.sliced
    assert "quant_method=fp8" in _broadcast_reason(plan)
    assert skeleton_and_plan(tiny_model_path).sliced


def test_a_tensor_of_the_modules_very_name_wins_over_a_stray_one_that_only_a_prefix_would_match(
    tiny_model_path, tmp_path
):
    folder = shutil.copytree(tiny_model_path, tmp_path / "stray")
    save_file({"norm.weight": torch.full((32,), 7.0)}, str(folder / "z_backbone.safetensors"))  # sorts after model.
    plan = skeleton_and_plan(str(folder))
    assert plan.sliced
    assert plan.keys["lm.model.norm.weight"] == "model.norm.weight"


def load_broken_folder(rank: int, path: str) -> str:
    """What each rank raises when the folder's only weights file is not a checkpoint (rank 0 loads it)."""
    fsdp = FSDPConfig()
    try:
        build_sharded(builders.policy_maker(ModelConfig(path=path), fsdp, path, True), path, fsdp, build_device_mesh())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "loaded"


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_when_rank_0_cannot_load_a_broadcast_every_rank_raises_instead_of_waiting(tiny_model_path, tmp_path):
    folder = folder_without_safetensors(tiny_model_path, str(tmp_path / "broken"))
    with open(os.path.join(folder, "pytorch_model.bin"), "wb") as f:
        f.write(b"not a checkpoint")
    rank0, rank1 = run_ranks(load_broken_folder, 2, folder, timeout_s=240)
    assert rank0 != "loaded"
    assert rank1.startswith("RuntimeError: lean load: rank 0 could not load")
    assert rank0 in rank1  # rank 0's own error, passed on
