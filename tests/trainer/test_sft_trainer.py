"""SFTTrainer and `hyflow sft`: the loss goes down, it is independent of micro-batching, runs resume, the saved
Hugging Face folder loads."""

import errno
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint.filesystem as dcp_filesystem
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from hyflow.config.sft import load_sft_config
from hyflow.data.prepare import prepare_task
from hyflow.models.lora import hf_name
from hyflow.models.tiny import build_tiny_model
from hyflow.trainer import main_sft
from hyflow.trainer.checkpoint_manager import StepCheckpoints
from hyflow.trainer.checkpoint_save import CheckpointSaveError
from hyflow.trainer.sft_trainer import HF_DIR, SFTTrainer
from hyflow.workers.fsdp import full_tensor

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models train fastest on one thread; more only contend for the CI box's two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sft")
    model = build_tiny_model(root / "model", hidden_size=32, num_layers=2, intermediate_size=64)
    data = prepare_task("arith", root / "data", seed=0, train_size=32, test_size=8, num_digits=1)
    return {"model": model, "train": data["train"], "val": data["test"]}


def overrides(assets: dict[str, str], out: Path, *extra: str) -> list[str]:
    return [
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['val']}",
        "data.response_key=extra_info.answer",
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=4",
        "data.shuffle=True",
        f"model.path={assets['model']}",
        "optim.lr=3e-3",
        "optim.lr_warmup_steps=0",
        "optim.lr_scheduler_type=constant",
        "trainer.total_training_steps=6",
        "trainer.logger=[file]",
        f"trainer.log_dir={out / 'logs'}",
        f"trainer.default_local_dir={out / 'ckpt'}",
        *extra,
    ]


def test_sft_lowers_the_loss_and_saves_a_hugging_face_folder_that_loads(assets, tmp_path):
    trainer = SFTTrainer(load_sft_config(overrides(assets, tmp_path, "trainer.test_freq=3")))
    history = trainer.fit()
    assert len(history) == 6
    assert history[-1]["train/loss"] < history[0]["train/loss"]
    assert history[-1]["val/loss"] < history[2]["val/loss"]
    assert (tmp_path / "ckpt" / "global_step_6" / "actor" / "hyflow_checkpoint.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / HF_DIR)
    trained = {hf_name(name): full_tensor(tensor) for name, tensor in trainer.module.state_dict().items()}
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, trained[name], msg=name)


def test_fit_stops_early_when_the_step_callback_says_so_and_still_saves(assets, tmp_path, capsys):
    trainer = SFTTrainer(load_sft_config(overrides(assets, tmp_path)))
    history = trainer.fit(on_step=lambda step, metrics: step == 2)
    assert len(history) == 2
    assert "sft:  33%|" in capsys.readouterr().err  # the progress bar, closed where training stopped (2 of 6)
    assert (tmp_path / "ckpt" / "global_step_2" / "trainer_state.pt").is_file()
    assert (tmp_path / "ckpt" / HF_DIR / "config.json").is_file()


def test_first_step_loss_and_gradient_do_not_depend_on_the_micro_batch_size(assets, tmp_path):
    results = []
    for micro in (1, 8):
        config = load_sft_config(overrides(assets, tmp_path / str(micro), f"data.micro_batch_size_per_gpu={micro}"))
        trainer = SFTTrainer(config)
        metrics = trainer.train_step(trainer.train_batch(0))
        results.append((float(metrics["train/loss"]), float(metrics["train/grad_norm"])))
    assert results[0] == pytest.approx(results[1], rel=1e-4)


def test_removing_padding_gives_the_same_first_step(assets, tmp_path):
    results = []
    for remove_padding in (False, True):
        extra = f"model.use_remove_padding={remove_padding}"
        trainer = SFTTrainer(load_sft_config(overrides(assets, tmp_path / str(remove_padding), extra)))
        metrics = trainer.train_step(trainer.train_batch(0))
        results.append((float(metrics["train/loss"]), float(metrics["train/grad_norm"])))
    assert results[0] == pytest.approx(results[1], rel=1e-4)


def test_a_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(assets, tmp_path):
    straight = SFTTrainer(load_sft_config(overrides(assets, tmp_path / "straight", "trainer.save_hf_model=False")))
    straight.fit()
    first = overrides(assets, tmp_path / "resumed", "trainer.save_freq=2", "trainer.save_hf_model=False")
    SFTTrainer(load_sft_config([*first, "trainer.total_training_steps=4"])).fit()
    resumed = SFTTrainer(load_sft_config(first))
    history = resumed.fit()
    assert len(history) == 2  # steps 5 and 6 only
    for (name, a), b in zip(straight.module.state_dict().items(), resumed.module.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_hyflow_sft_reports_an_unknown_key_with_a_suggestion_and_exits_2(capsys):
    assert main_sft.main(["data.max_lenght=12"]) == 2
    assert "Did you mean 'data.max_length'?" in capsys.readouterr().err


def test_hyflow_sft_without_train_files_says_which_key_to_set(assets, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as trainer.device=cpu does; restored afterwards
    assert main_sft.main([f"model.path={assets['model']}", "trainer.device=cpu"]) == 2
    assert "data.train_files=None" in capsys.readouterr().err


def test_sft_help_says_that_save_freq_minus_one_saves_at_the_end_unlike_hyflow_train(capsys):
    assert main_sft.main(["--help"]) == 0

    help_text = " ".join(capsys.readouterr().out.split())
    assert "the default, -1 (as verl's SFT), saves only at the end, and 0 saves none" in help_text
    assert "(in `hyflow train`, -1 saves none)" in help_text


def test_a_run_with_save_freq_0_says_at_its_end_that_it_saved_no_checkpoint(assets, tmp_path, caplog):
    config = load_sft_config(overrides(assets, tmp_path, "trainer.save_freq=0", "trainer.total_training_steps=1"))

    with caplog.at_level("WARNING", logger="hyflow.trainer.sft_trainer"):
        SFTTrainer(config).fit()

    assert "this run trained 1 step(s) and saved no checkpoint (trainer.save_freq=0: 0 saves none" in caplog.text
    assert f"the trained model is the Hugging Face folder {tmp_path / 'ckpt' / HF_DIR}" in caplog.text
    assert not (tmp_path / "ckpt" / "global_step_1").exists()


def test_a_run_that_saved_a_checkpoint_does_not_say_it_saved_none(assets, tmp_path, caplog):
    one_step = overrides(assets, tmp_path, "trainer.total_training_steps=1", "trainer.save_hf_model=False")
    config = load_sft_config(one_step)

    with caplog.at_level("WARNING", logger="hyflow.trainer.sft_trainer"):
        SFTTrainer(config).fit()

    assert "saved no checkpoint" not in caplog.text
    assert (tmp_path / "ckpt" / "global_step_1" / "trainer_state.pt").is_file()


def test_hyflow_sft_stopped_by_sigterm_names_the_last_checkpoint_and_exits_143(assets, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as trainer.device=cpu does; restored afterwards
    steps = StepCheckpoints(tmp_path / "ckpt")
    steps.step_dir(4)
    steps.finalize(4)  # a checkpoint an earlier part of the run saved

    def stopped_while_training(config):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5.0)  # cut short: the handler runs at the next bytecode

    def unhandled(signum, frame):
        raise AssertionError("SIGTERM reached the test's own handler: hyflow sft did not handle it")

    monkeypatch.setattr(main_sft, "run_sft", stopped_while_training)
    previous = signal.signal(signal.SIGTERM, unhandled)  # without the entry's handler: fail, not end the session
    try:
        code = main_sft.main(overrides(assets, tmp_path, "trainer.device=cpu"))
    finally:
        signal.signal(signal.SIGTERM, previous)

    assert code == 143
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    expected = f"hyflow sft: stopped by SIGTERM; the last complete checkpoint is {steps.root / 'global_step_4'} "
    assert last_line.startswith(expected)


def test_a_full_disk_during_an_sft_save_is_one_error_naming_the_folder_and_leaves_no_unfinished_files(
    assets, tmp_path, monkeypatch
):
    trainer = SFTTrainer(load_sft_config(overrides(assets, tmp_path)))

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(dcp_filesystem, "_write_item", disk_full)  # every shard write hits a full disk
    with pytest.raises(CheckpointSaveError) as caught:
        trainer.save_checkpoint()

    message = str(caught.value)
    assert f"into {tmp_path / 'ckpt' / 'global_step_0'} failed: OSError: [Errno 28] No space left" in message
    assert "Free space there: " in message and "(trainer.max_ckpt_to_keep=N)" in message
    assert list((tmp_path / "ckpt").iterdir()) == []


def _first_step_on_two_ranks(rank: int, assets: dict[str, str], out: Path, port: int, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    trainer = SFTTrainer(load_sft_config(overrides(assets, out / str(rank))))
    metrics = trainer.train_step(trainer.train_batch(0))
    if rank == 0:
        results.put((float(metrics["train/loss"]), float(metrics["train/grad_norm"])))
    dist.destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.skipif(torch.cuda.is_available(), reason="the two ranks share the CPU (gloo)")
def test_two_fsdp2_ranks_take_the_same_first_step_as_one_process(assets, tmp_path):
    single = SFTTrainer(load_sft_config(overrides(assets, tmp_path / "single")))
    metrics = single.train_step(single.train_batch(0))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(_first_step_on_two_ranks, args=(assets, tmp_path, port, results), nprocs=2, start_method="spawn")
    loss, grad_norm = results.get()
    assert loss == pytest.approx(float(metrics["train/loss"]), rel=1e-4)
    assert grad_norm == pytest.approx(float(metrics["train/grad_norm"]), rel=1e-3)
