"""hyflow.workers: the role workers and the FSDP2 training engine under them.

- `actor_rollout_ref.py`: `ActorRolloutRefWorker` (actor, rollout and ref roles composed in one process)
- `critic_worker.py`: `CriticWorker`;  `reward_model.py`: `RewardModelWorker`
- `actor.py` / `critic.py`: `DataParallelPPOActor` / `DataParallelPPOCritic` (mini/micro-batched PPO updates);
  `moe_balance.py`: the actor's mixture-of-experts terms (router load-balancing loss, expert-load metrics)
- `batching.py` (mini/micro-batches, token budgets), `optim.py` (AdamW, schedules, guarded step), `fsdp.py`
  (FSDP2 wrapping, offload), `lean_load.py` (each rank reads only its shards of the checkpoint;
  `lean_load_experts.py`: its own MoE experts), `checkpoint.py` (sharded atomic checkpoints),
  `builders.py` (config → pieces), `merge.py` (`hyflow merge`: checkpoint → Hugging Face folder)
"""
