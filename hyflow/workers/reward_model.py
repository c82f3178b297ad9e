"""`RewardModelWorker`: a model-based reward. A sequence classifier scores each (prompt, response) conversation.

    wg = LocalWorkerGroup(ClassWithInitArgs(RewardModelWorker, config=config.reward_model))
    wg.init_model()
    rm_scores = wg.compute_rm_score(batch)          # DataProto with rm_scores (B, R)
    batch = batch.union(rm_scores)                  # reward managers add it to (or use it for) the task reward

The reward model has its own tokenizer, which may differ from the policy's: each response is decoded with the
policy's tokenizer (`reward_model.model.input_tokenizer`, by default the actor's model folder), appended to the
row's chat (`raw_prompt`, so the dataset needs `data.return_raw_chat=True`) as an assistant message, and the
conversation is rendered with the reward model's own chat template. Inputs longer than `reward_model.max_length`
keep their last tokens (the end of the response is what gets scored). Rows are scored in micro-batches of
`micro_batch_size_per_gpu` (all at once when unset); the score lands on the last valid response token.

Over several ranks the model loads lean (`hyflow/workers/lean_load.py`, as the actor, ref and critic do): each
rank builds it on `meta`, FSDP2 shards it (the `score` head with the root), and the rank reads only its rows of
each tensor from the folder's safetensors (`scorer.load_stats` says how it loaded and what it read). One rank
loads with `from_pretrained`.

Shapes: B rows; R response length; L the reward model's (left-padded) input length.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from hyflow import fields as F
from hyflow.config.reward import RewardModelConfig
from hyflow.controller import Dispatch, Worker, register
from hyflow.data.dataset import left_pad
from hyflow.models.loader import check_local_model_folder, load_model_config, load_sequence_classifier, load_tokenizer
from hyflow.protocol import DataProto
from hyflow.workers.builders import import_external_lib
from hyflow.workers.fsdp import build_device_mesh, reshard, to_dtype, training_device
from hyflow.workers.lean_load import Make, build_sharded

logger = logging.getLogger(__name__)

_KEY = "reward_model.model.path"


def reward_model_maker(config: RewardModelConfig, path: str, pad_token_id: int) -> Make:
    """`make(empty_weights) -> (the sequence classifier, itself)` for `lean_load.build_sharded`: the reward model
    in `fsdp_config.model_dtype`, in eval mode, pooling the last token that is not `pad_token_id` (the reward
    model's tokenizer's pad)."""
    dtype = to_dtype(config.model.fsdp_config.model_dtype, "reward_model.model.fsdp_config.model_dtype")

    def make(empty_weights: bool) -> tuple[nn.Module, nn.Module]:
        model = load_sequence_classifier(
            path, dtype, config.model.trust_remote_code, key=_KEY, empty_weights=empty_weights
        )
        model.config.pad_token_id = pad_token_id  # the classifier pools the last non-pad token
        return model.eval(), model

    return make


class RewardModelScorer:
    """The reward model, its tokenizer and the policy's tokenizer; turns a DataProto into `rm_scores`."""

    def __init__(self, config: RewardModelConfig) -> None:
        if config.model.path is None:
            raise ValueError(
                f"{_KEY} is not set, but reward_model.enable=True; point it at a local sequence-classification "
                "model folder, or set reward_model.enable=False."
            )
        path = check_local_model_folder(config.model.path, _KEY)
        self.config = config
        self.tokenizer = load_tokenizer(path, require_chat_template=True, key=_KEY)
        input_path = config.model.input_tokenizer or path
        self.input_tokenizer = load_tokenizer(input_path, key="reward_model.model.input_tokenizer")
        import_external_lib(config.model)
        hf_config = load_model_config(path, trust_remote_code=config.model.trust_remote_code)
        if hf_config.num_labels != 1:
            raise ValueError(
                f"{_KEY}={path!r} has num_labels={hf_config.num_labels} (architectures={hf_config.architectures}); "
                "a reward model is a sequence classifier with one score (num_labels=1)."
            )
        self.device = training_device()
        make = reward_model_maker(config, path, self.tokenizer.pad_token_id)
        self.model, self.load_stats = build_sharded(
            make, path, config.model.fsdp_config, build_device_mesh(), "reward_model.model.fsdp_config"
        )

    def conversation_ids(self, data: DataProto, response_lengths: list[int]) -> list[list[int]]:
        """Each row's chat plus its decoded response, templated and tokenized for the reward model."""
        if F.RAW_PROMPT not in data.non_tensor_batch:
            raise ValueError(
                "the reward model re-templates each conversation from its chat messages, but the batch has no "
                f"'{F.RAW_PROMPT}'; set data.return_raw_chat=True."
            )
        responses = data.batch[F.RESPONSES]
        max_length = self.config.max_length
        all_ids = []
        for row, length in enumerate(response_lengths):
            text = self.input_tokenizer.decode(responses[row, :length], skip_special_tokens=True)
            chat = [*list(data.non_tensor_batch[F.RAW_PROMPT][row]), {"role": "assistant", "content": text}]
            rendered = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
            ids = list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
            all_ids.append(ids[-max_length:] if max_length else ids)
        return all_ids

    @torch.no_grad()
    def score_ids(self, all_ids: list[list[int]]) -> torch.Tensor:
        """(B,) float32 scores of tokenized conversations, in micro-batches."""
        micro = self.config.micro_batch_size_per_gpu or len(all_ids)
        scores = []
        for start in range(0, len(all_ids), micro):
            chunk = all_ids[start : start + micro]
            width = max(len(ids) for ids in chunk)
            padded = [left_pad(ids, width, self.tokenizer.pad_token_id) for ids in chunk]
            input_ids, attention_mask, position_ids = (torch.stack(t).to(self.device) for t in zip(*padded))
            output = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
            scores.append(output.logits[:, 0].float().cpu())
        reshard(self.model)  # FSDP2 keeps the root's gathered weights (embeddings, score) after a forward: free them
        return torch.cat(scores)

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """DataProto with `rm_scores` (B, R): each row's score on its last valid response token."""
        responses = data.batch[F.RESPONSES]
        num_rows, response_len = responses.shape
        lengths = data.batch[F.ATTENTION_MASK][:, -response_len:].sum(-1).tolist()
        scores = self.score_ids(self.conversation_ids(data, lengths)) if num_rows else torch.zeros(0)
        rm_scores = torch.zeros(num_rows, response_len, dtype=torch.float32)
        for row, length in enumerate(lengths):
            if length > 0:
                rm_scores[row, length - 1] = scores[row]
        return DataProto.from_dict({F.RM_SCORES: rm_scores})


class RewardModelWorker(Worker):
    """One process per device holding the reward model (FSDP2-sharded when the group has several ranks)."""

    def __init__(self, config: RewardModelConfig) -> None:
        self.config = config
        self.scorer: RewardModelScorer | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the reward model and both tokenizers."""
        if self.world_size > 1:
            self.init_distributed()
        self.scorer = RewardModelScorer(self.config)
        logger.info("rank %d: reward model loaded from %s", self.rank, self.config.model.path)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """This rank's shard of the batch -> `rm_scores` (B, R)."""
        if self.scorer is None:
            raise RuntimeError("RewardModelWorker.compute_rm_score called before init_model(); call init_model first.")
        return self.scorer.compute_rm_score(data)
