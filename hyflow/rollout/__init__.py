"""The trainer's side of generation: adapters between `DataProto` batches and the engine (`hyflow.engine`).

Files: worker_rollout (`EngineRollout`, `build_rollout`: the rollout object of `ActorRolloutRefWorker`), hf_rollout
(the `transformers.generate` fallback, `rollout.name=hf`), batch (requests' outputs packed into response tensors),
generate (`hyflow generate`: sample a parquet of chat prompts), policy_versions (the policy versions of a batch's
tokens: each row's range, metrics).
"""
