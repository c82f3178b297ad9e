"""verl's own geo3k launch script (GRPO on Qwen2.5-VL, `run_qwen2_5_vl_7b_fsdp.sh`), with only the module name
changed, trains on the CPU with a tiny VLM: its sizes shrunk through the script's environment variables, its
`$HOME/data/geo3k` paths local, the data made by `hyflow prepare-data geo3k` from Geometry3K-format files. The
script's keys stay as verl writes them: vLLM rollout (a VLM falls back to transformers.generate), padding removal
and token-budget micro-batches for the actor and the log-prob passes, its console + wandb loggers (offline)."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw

import hyflow.agent
from hyflow.models.tiny_vlm import build_tiny_vlm
from tests.process_kit import shell_env
from tests.trainer.tracker_readers import wandb_history

SCRIPT = Path(__file__).parent / "verl_scripts" / "run_qwen2_5_vl_7b_fsdp.sh"
ZOOM_TOOLS = Path(hyflow.agent.__file__).parent / "configs" / "image_zoom_tool.yaml"

# The script's own knobs (verl reads the same variables), shrunk for a tiny model on two CPU cores.
SHRUNK = {
    "NGPUS_PER_NODE": "1",
    "TRAIN_BATCH_SIZE": "4",
    "PPO_MINI_BATCH_SIZE": "4",
    "MAX_PROMPT_LENGTH": "160",
    "MAX_RESPONSE_LENGTH": "8",
    "PPO_MAX_TOKEN_LEN_PER_GPU": "400",
    "ROLLOUT_N": "2",
    "ROLLOUT_TP": "1",
    "TOTAL_EPOCHS": "1",
    "SAVE_FREQ": "-1",
    "TEST_FREQ": "-1",
    "PROJECT_NAME": "verl_grpo_geo3k",
    "EXPERIMENT_NAME": "tiny_cpu",
}


def write_geometry3k(folder: Path, num_rows: int = 8) -> None:
    """Geometry3K's original train/test parquet files: a figure per problem, which starts with <image>."""
    folder.mkdir(parents=True)
    records = []
    for i in range(num_rows):
        figure = Image.new("RGB", (112, 84), "white")
        ImageDraw.Draw(figure).polygon([(10, 70), (100, 70), (10, 10 + 5 * i)], outline="black")
        buffer = io.BytesIO()
        figure.save(buffer, format="PNG")
        records.append(
            {"images": [{"bytes": buffer.getvalue(), "path": None}], "problem": "<image>Find x.", "answer": str(i)}
        )
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(records), folder / f"geometry3k_{split}.parquet")


def launch(home: Path, *extra: str) -> list[dict]:
    """Run the script under `home` (its $HOME) and return the wandb run's logged rows."""
    write_geometry3k(home / "raw")
    env = shell_env() | {"HOME": str(home), "CUDA_VISIBLE_DEVICES": "", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None), env.pop("WANDB_MODE", None), env.pop("WANDB_DIR", None)
    prepare = ["hyflow", "prepare-data", "geo3k", "--input", "raw", "--output", "data/geo3k"]
    subprocess.run(prepare, cwd=home, env=env, check=True, capture_output=True, timeout=120)
    model = build_tiny_vlm(home / "tiny-vlm")
    command = ["bash", str(SCRIPT), "trainer.total_training_steps=2", *extra]
    result = subprocess.run(
        command, cwd=home, env=env | SHRUNK | {"MODEL_PATH": model}, capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (run_folder,) = home.glob("**/wandb/offline-run-*")
    return wandb_history(run_folder)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_verls_geo3k_script_trains_a_tiny_vlm_on_the_cpu_with_the_module_name_changed(tmp_path):
    rows = launch(tmp_path)
    assert [row["_step"] for row in rows if "actor/pg_loss" in row] == [1, 2]
    assert all(row["response_length/mean"] > 0 for row in rows if "actor/pg_loss" in row)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_geo3k_script_trains_through_the_tool_agent_loop_with_the_zoom_tool(tmp_path):
    """The same script with verl's multi-turn keys: image prompts through the tool agent loop (the zoom tool
    offered), trajectories with M-RoPE positions and their images back into training."""
    multi_turn = [
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={ZOOM_TOOLS}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "data.return_raw_chat=True",
    ]
    rows = launch(tmp_path, *multi_turn)
    trained = [row for row in rows if "actor/pg_loss" in row]
    assert [row["_step"] for row in trained] == [1, 2]
    assert all(row["agent/num_turns/mean"] >= 2 for row in trained)
