"""Multi-turn (tool-agent) GRPO on the Ray backend: the agent loops run in the controller and generate through
two CPU rollout workers' async `generate_request`, each conversation kept on one worker."""

from __future__ import annotations

from pathlib import Path

import pytest

import hyflow.agent
from hyflow.agent.server import WorkerServer
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import build_assets, read_metrics, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300), pytest.mark.usefixtures("in_tmp_path")]

CALCULATOR_TOOLS = Path(hyflow.agent.__file__).parent / "configs" / "calculator_tool.yaml"


class CountingServer:
    """Wraps a server and records which conversations it served."""

    def __init__(self, server) -> None:
        self.server = server
        self.conversations: set[str] = set()

    async def generate(self, request_id, prompt_ids, sampling_params):
        self.conversations.add(request_id)
        return await self.server.generate(request_id, prompt_ids, sampling_params)


def test_tool_agent_grpo_runs_on_two_ray_rollout_workers_and_spreads_the_conversations(ray_started_here, tmp_path):
    assets = build_assets(tmp_path / "assets")
    config = tiny_config(
        assets,
        tmp_path,
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "trainer.ray_init.num_cpus=2",
        "data.return_raw_chat=True",
        "data.max_prompt_length=352",  # the calculator's schema sits in the system turn
        "data.max_response_length=16",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={CALCULATOR_TOOLS}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
    )
    trainer = PPOTrainer(config)
    trainer.init_workers()
    try:
        router = trainer.agent_manager.router
        assert len(router.servers) == 2 and all(isinstance(s, WorkerServer) for s in router.servers)
        router.servers = [CountingServer(server) for server in router.servers]
        trainer.fit()
    finally:
        trainer.close()

    served = [server.conversations for server in router.servers]
    assert all(served) and not served[0] & served[1]  # both workers generated; no conversation on both
    assert router.active == [0, 0]  # every conversation was released
    steps = read_metrics(trainer.tracking.log_dir)
    assert [s["step"] for s in steps] == [1, 2]
    last = steps[-1]["data"]
    assert {"actor/pg_loss", "agent/num_turns/mean", "agent/num_tool_calls/mean", "timing_s/gen"} <= set(last)
    assert last["response_length/max"] <= 16
