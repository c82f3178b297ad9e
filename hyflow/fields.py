"""Every field name that travels in a `DataProto`, with its shape, dtype and meaning.

Code that reads or writes a `DataProto` key imports its constant from here (`from hyflow import fields as F`,
then `data.batch[F.RESPONSE_MASK]`), so one grep finds every producer and consumer of a field, and a new field is
added here first. `describe(key)` gives the one-line description used in error messages.

Shape legend: B = batch rows (one row per sampled response, so `train_batch_size * rollout.n` in training),
P = prompt length (left-padded), R = response length (right-padded), T = P + R (the full sequence), Lm = MoE layers
and k = experts per token of a mixture-of-experts model,
Token masks are int64 0/1, as the tokenizer returns them.

Tensor fields (`DataProto.batch`):

| name                | shape  | dtype   | meaning                                                                |
|---------------------|--------|---------|------------------------------------------------------------------------|
| input_ids           | (B, T) | int64   | prompt then response token ids (prompt left-, response right-padded)   |
| attention_mask      | (B, T) | int64   | 1 = real token, 0 = padding                                            |
| position_ids        | (B, T) | int64   | position of each token, counted over real tokens only                  |
| prompts             | (B, P) | int64   | prompt token ids, left-padded                                          |
| responses           | (B, R) | int64   | response token ids (model, tool and user tokens), right-padded         |
| response_mask       | (B, R) | int64   | 1 = model token in the loss, 0 = pad / tool / user token               |
| old_log_probs       | (B, R) | float32 | log-prob of each response token under the actor before the update      |
| ref_log_prob        | (B, R) | float32 | log-prob of each response token under the reference policy             |
| teacher_log_probs   | (B, R) | float32 | log-prob of each response token under the teacher model                |
| rollout_log_probs   | (B, R) | float32 | log-prob the generation engine reported when it sampled the token      |
| rollout_is_weights  | (B, R) | float32 | truncated IS weight π_old/π_rollout per token (0 on padding), detached |
| entropys            | (B, R) | float32 | entropy of the actor's next-token distribution at each position        |
| values              | (B, R) | float32 | critic's value estimate at each response position                      |
| rm_scores           | (B, R) | float32 | reward-model score, placed on the last valid response token            |
| token_level_scores  | (B, R) | float32 | task reward, placed on the last valid response token                   |
| token_level_rewards | (B, R) | float32 | token_level_scores minus the KL penalty when use_kl_in_reward          |
| reward_baselines    | (B,)   | float32 | greedy-response reward, the ReMax baseline                             |
| advantages          | (B, R) | float32 | advantage estimate of each response token                              |
| returns             | (B, R) | float32 | return (critic target) of each response token                          |
| rollout_policy_versions | (B, R) | int64 | policy version (weights) that sampled each token; -1 on padding     |
| routed_experts      | (B, T, Lm, k) | uint8 | experts each of the Lm MoE layers chose per token (routing replay); |
|                     |        | (int16) | int16 over 255 experts; all bits set (255 / -1) = no record            |

Non-tensor fields (`DataProto.non_tensor_batch`, 1-D numpy object arrays of length B):

| name               | element     | meaning                                                                 |
|--------------------|-------------|-------------------------------------------------------------------------|
| uid                | str         | id of the prompt a row was sampled from; the group id of GRPO & co.     |
| data_source        | str         | dataset name, selects the reward scorer                                 |
| ability            | str         | task category from the dataset row (e.g. "math")                        |
| reward_model       | dict        | {"style": "rule", "ground_truth": ...} from the dataset row             |
| extra_info         | dict        | free-form per-row info from the dataset (split, index, tools, ...)      |
| raw_prompt         | list[dict]  | the prompt as chat messages, before the chat template                   |
| raw_prompt_ids     | list[int]   | prompt token ids without padding, what the generation engine reads      |
| agent_name         | str         | agent loop that runs this row (single_turn_agent, tool_agent, ...)      |
| index              | int         | row index in the dataset                                                |
| tools_kwargs       | dict        | per-tool arguments for this row's tool instances                        |
| interaction_kwargs | dict        | arguments for this row's user-simulating interaction                    |
| num_turns          | int         | number of chat turns the agent loop ran (user + assistant + tool)       |
| finish_reason      | str         | why generation ended: "stop", "length", "max_turns", "abort"            |
| turn_scores        | list[float] | the interaction's reward for each user turn of an agent episode         |
| tool_rewards       | list[float] | the reward each executed tool call returned                             |
| tool_scores        | dict        | tool name -> that tool's `calc_reward` score for the whole episode      |
| multi_modal_data   | dict        | {"image": [PIL images], "video": [Video]} of the prompt, for rollouts   |
| multi_modal_inputs | dict        | processor outputs of the row (pixel_values, image_grid_thw; videos:     |
|                    |             | pixel_values_videos, video_grid_thw, Qwen2.5-VL second_per_grid_ts) for |
|                    |             | the training forward, the prompt's plus a tool's images and videos      |
|                    |             | after an agent loop; position_ids are then (B, 3, T) M-RoPE rows        |
| agent_reward       | float/None  | the reward an `openai_agent` function returned (None: it returned none) |
|                    |             | and the row's score in every reward manager (reward/managers/base.py)   |
| rollout_policy_version_min | int | oldest policy version among a row's tokens (-1: no token)       |
| rollout_policy_version_max | int | newest policy version among a row's tokens (-1: no token)       |

Meta fields (`DataProto.meta_info`, one value for the whole batch):

| name             | type      | meaning                                                                   |
|------------------|-----------|---------------------------------------------------------------------------|
| temperature      | float     | sampling temperature; log-probs are computed from logits / temperature    |
| do_sample        | bool      | sample (True) or decode greedily (False)                                  |
| validate         | bool      | the batch is a validation batch (use the validation sampling settings)    |
| eos_token_id     | int       | end-of-sequence token id                                                  |
| pad_token_id     | int       | padding token id                                                          |
| global_token_num | list[int] | number of valid tokens of each row, for throughput metrics                |
| global_steps     | int       | the trainer's step counter                                                |
| seed             | int       | sampling seed of a generation batch (each row's seed is derived from it)  |
| micro_batch_size | int       | micro-batch size a worker should use for this call                        |
| max_token_len    | int       | token budget per micro-batch when use_dynamic_bsz                         |
| use_dynamic_bsz  | bool      | cut micro-batches by token budget instead of by row count                 |
| metrics          | dict      | metrics a worker returns to the controller                                |
| timing           | dict      | seconds a worker spent in each stage                                      |
| rollout_correction | dataclass | `algorithm.rollout_correction` (bypass mode), read by the `reinforce_is` loss |
| distillation_loss | dataclass | `distillation.distillation_loss` (direct form), read by the actor's loss       |
| reward_extra_keys | list[str] | the non-tensor columns a reward manager added (its extras and flags)     |
"""

import difflib
from dataclasses import dataclass
from typing import Literal

FieldKind = Literal["tensor", "non_tensor", "meta"]


@dataclass(frozen=True)
class FieldSpec:
    """Shape, dtype and meaning of one field. `shape` uses the legend above; for meta fields it is ``""``."""

    name: str
    shape: str
    dtype: str
    kind: FieldKind
    meaning: str


# ---- tensor fields (DataProto.batch) ----
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
PROMPTS = "prompts"
RESPONSES = "responses"
RESPONSE_MASK = "response_mask"
OLD_LOG_PROBS = "old_log_probs"
REF_LOG_PROB = "ref_log_prob"
TEACHER_LOG_PROBS = "teacher_log_probs"
ROLLOUT_LOG_PROBS = "rollout_log_probs"
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
ENTROPYS = "entropys"
VALUES = "values"
RM_SCORES = "rm_scores"
TOKEN_LEVEL_SCORES = "token_level_scores"
TOKEN_LEVEL_REWARDS = "token_level_rewards"
REWARD_BASELINES = "reward_baselines"
ADVANTAGES = "advantages"
RETURNS = "returns"
ROUTED_EXPERTS = "routed_experts"

# ---- non-tensor fields (DataProto.non_tensor_batch) ----
UID = "uid"
DATA_SOURCE = "data_source"
ABILITY = "ability"
REWARD_MODEL = "reward_model"
EXTRA_INFO = "extra_info"
RAW_PROMPT = "raw_prompt"
RAW_PROMPT_IDS = "raw_prompt_ids"
AGENT_NAME = "agent_name"
INDEX = "index"
TOOLS_KWARGS = "tools_kwargs"
INTERACTION_KWARGS = "interaction_kwargs"
NUM_TURNS = "num_turns"
FINISH_REASON = "finish_reason"
TURN_SCORES = "turn_scores"
TOOL_REWARDS = "tool_rewards"
TOOL_SCORES = "tool_scores"
MULTI_MODAL_DATA = "multi_modal_data"
MULTI_MODAL_INPUTS = "multi_modal_inputs"
AGENT_REWARD = "agent_reward"

# ---- meta fields (DataProto.meta_info) ----
TEMPERATURE = "temperature"
DO_SAMPLE = "do_sample"
VALIDATE = "validate"
EOS_TOKEN_ID = "eos_token_id"
PAD_TOKEN_ID = "pad_token_id"
GLOBAL_TOKEN_NUM = "global_token_num"
GLOBAL_STEPS = "global_steps"
SEED = "seed"
METRICS = "metrics"
ROLLOUT_CORRECTION = "rollout_correction"
DISTILLATION_LOSS = "distillation_loss"
TIMING = "timing"
REWARD_EXTRA_KEYS = "reward_extra_keys"
ROLLOUT_POLICY_VERSIONS = "rollout_policy_versions"
ROLLOUT_POLICY_VERSION_MIN = "rollout_policy_version_min"
ROLLOUT_POLICY_VERSION_MAX = "rollout_policy_version_max"

_TOKEN_F = "float32"
_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(INPUT_IDS, "(B, T)", "int64", "tensor", "prompt then response token ids"),
    FieldSpec(ATTENTION_MASK, "(B, T)", "int64", "tensor", "1 = real token, 0 = padding"),
    FieldSpec(POSITION_IDS, "(B, T)", "int64", "tensor", "position of each token, counted over real tokens"),
    FieldSpec(PROMPTS, "(B, P)", "int64", "tensor", "prompt token ids, left-padded"),
    FieldSpec(RESPONSES, "(B, R)", "int64", "tensor", "response token ids (model, tool and user), right-padded"),
    FieldSpec(RESPONSE_MASK, "(B, R)", "int64", "tensor", "1 = model token in the loss, 0 = pad / tool / user token"),
    FieldSpec(OLD_LOG_PROBS, "(B, R)", _TOKEN_F, "tensor", "log-prob of each token under the actor before the update"),
    FieldSpec(REF_LOG_PROB, "(B, R)", _TOKEN_F, "tensor", "log-prob of each response token under the reference policy"),
    FieldSpec(
        TEACHER_LOG_PROBS, "(B, R)", _TOKEN_F, "tensor", "log-prob of each response token under the teacher model"
    ),
    FieldSpec(ROLLOUT_LOG_PROBS, "(B, R)", _TOKEN_F, "tensor", "log-prob the generation engine reported at sampling"),
    FieldSpec(ROLLOUT_IS_WEIGHTS, "(B, R)", _TOKEN_F, "tensor", "truncated IS weight π_old/π_rollout the loss applies"),
    FieldSpec(ENTROPYS, "(B, R)", _TOKEN_F, "tensor", "entropy of the actor's next-token distribution"),
    FieldSpec(VALUES, "(B, R)", _TOKEN_F, "tensor", "critic's value estimate at each response position"),
    FieldSpec(RM_SCORES, "(B, R)", _TOKEN_F, "tensor", "reward-model score on the last valid response token"),
    FieldSpec(TOKEN_LEVEL_SCORES, "(B, R)", _TOKEN_F, "tensor", "task reward on the last valid response token"),
    FieldSpec(TOKEN_LEVEL_REWARDS, "(B, R)", _TOKEN_F, "tensor", "token_level_scores minus the KL penalty in reward"),
    FieldSpec(REWARD_BASELINES, "(B,)", _TOKEN_F, "tensor", "greedy-response reward, the ReMax baseline"),
    FieldSpec(ADVANTAGES, "(B, R)", _TOKEN_F, "tensor", "advantage estimate of each response token"),
    FieldSpec(RETURNS, "(B, R)", _TOKEN_F, "tensor", "return (critic target) of each response token"),
    FieldSpec(UID, "(B,)", "str", "non_tensor", "id of the prompt a row was sampled from (the group id)"),
    FieldSpec(DATA_SOURCE, "(B,)", "str", "non_tensor", "dataset name; selects the reward scorer"),
    FieldSpec(ABILITY, "(B,)", "str", "non_tensor", "task category from the dataset row"),
    FieldSpec(REWARD_MODEL, "(B,)", "dict", "non_tensor", "{'style': ..., 'ground_truth': ...} from the dataset row"),
    FieldSpec(EXTRA_INFO, "(B,)", "dict", "non_tensor", "free-form per-row info from the dataset"),
    FieldSpec(RAW_PROMPT, "(B,)", "list[dict]", "non_tensor", "the prompt as chat messages, before the template"),
    FieldSpec(RAW_PROMPT_IDS, "(B,)", "list[int]", "non_tensor", "prompt token ids without padding"),
    FieldSpec(AGENT_NAME, "(B,)", "str", "non_tensor", "agent loop that runs this row"),
    FieldSpec(INDEX, "(B,)", "int", "non_tensor", "row index in the dataset"),
    FieldSpec(TOOLS_KWARGS, "(B,)", "dict", "non_tensor", "per-tool arguments for this row's tool instances"),
    FieldSpec(INTERACTION_KWARGS, "(B,)", "dict", "non_tensor", "arguments for this row's interaction"),
    FieldSpec(NUM_TURNS, "(B,)", "int", "non_tensor", "number of chat turns the agent loop ran"),
    FieldSpec(FINISH_REASON, "(B,)", "str", "non_tensor", "why generation ended: stop, length, max_turns, abort"),
    FieldSpec(TURN_SCORES, "(B,)", "list[float]", "non_tensor", "the interaction's reward for each user turn"),
    FieldSpec(TOOL_REWARDS, "(B,)", "list[float]", "non_tensor", "the reward each executed tool call returned"),
    FieldSpec(TOOL_SCORES, "(B,)", "dict", "non_tensor", "tool name -> that tool's score for the whole episode"),
    FieldSpec(MULTI_MODAL_DATA, "(B,)", "dict", "non_tensor", "{'image': [PIL], 'video': [Video]} of the prompt"),
    FieldSpec(MULTI_MODAL_INPUTS, "(B,)", "dict", "non_tensor", "processor outputs (pixel_values, *_grid_thw, ...)"),
    FieldSpec(AGENT_REWARD, "(B,)", "float", "non_tensor", "an openai_agent's reward (the row's score), or None"),
    FieldSpec(TEMPERATURE, "", "float", "meta", "sampling temperature; log-probs use logits / temperature"),
    FieldSpec(DO_SAMPLE, "", "bool", "meta", "sample (True) or decode greedily (False)"),
    FieldSpec(VALIDATE, "", "bool", "meta", "the batch is a validation batch"),
    FieldSpec(EOS_TOKEN_ID, "", "int", "meta", "end-of-sequence token id"),
    FieldSpec(PAD_TOKEN_ID, "", "int", "meta", "padding token id"),
    FieldSpec(GLOBAL_TOKEN_NUM, "", "list[int]", "meta", "number of valid tokens of each row"),
    FieldSpec(GLOBAL_STEPS, "", "int", "meta", "the trainer's step counter"),
    FieldSpec(SEED, "", "int", "meta", "sampling seed of a generation batch (each row's seed derives from it)"),
    FieldSpec(METRICS, "", "dict", "meta", "metrics a worker returns to the controller"),
    FieldSpec(TIMING, "", "dict", "meta", "seconds a worker spent in each stage"),
    FieldSpec(ROLLOUT_CORRECTION, "", "RolloutCorrectionConfig", "meta", "bypass mode's settings for its policy loss"),
    FieldSpec(DISTILLATION_LOSS, "", "DistillationLossConfig", "meta", "distillation's direct-loss settings"),
    FieldSpec(REWARD_EXTRA_KEYS, "", "list[str]", "meta", "the non-tensor columns a reward manager added"),
    FieldSpec(
        ROUTED_EXPERTS,
        "(B, T, Lm, k)",
        "uint8/int16",
        "tensor",
        "experts each MoE layer chose per token (routing replay R2/R3); all bits set = no record",
    ),
    FieldSpec(ROLLOUT_POLICY_VERSIONS, "(B, R)", "int64", "tensor", "policy version that sampled each token, -1 = pad"),
    FieldSpec(ROLLOUT_POLICY_VERSION_MIN, "(B,)", "int", "non_tensor", "oldest policy version of a row's tokens"),
    FieldSpec(ROLLOUT_POLICY_VERSION_MAX, "(B,)", "int", "non_tensor", "newest policy version of a row's tokens"),
)

FIELDS: dict[str, FieldSpec] = {spec.name: spec for spec in _SPECS}
TENSOR_FIELDS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.kind == "tensor")
NON_TENSOR_FIELDS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.kind == "non_tensor")
META_FIELDS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.kind == "meta")


def describe(key: str) -> str:
    """One line about `key` for error messages, e.g. ``"response_mask (tensor int64 (B, R)): 1 = model token ..."``.

    An unknown key is described as such, with the closest known name when there is one.
    """
    spec = FIELDS.get(key)
    if spec is None:
        close = difflib.get_close_matches(key, FIELDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"{key} (not a hyflow field, see hyflow/fields.py{hint})"
    layout = f"{spec.dtype} {spec.shape}" if spec.shape else spec.dtype
    return f"{spec.name} ({spec.kind} {layout}): {spec.meaning}"
