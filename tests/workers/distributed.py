"""Run a function on N local ranks (spawned processes, gloo or NCCL) and collect what each rank returns."""

import os
import tempfile
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank: int, world_size: int, port: int, out_dir: str, backend: str, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)  # rank r trains on GPU r
        # The store lives in the parent (run_ranks), so no rank's exit can pull it from under another's teardown.
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        result = fn(rank, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # every rank done with its collectives before any tears the group down
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args, timeout_s: float = 240.0, backend: str = "gloo") -> list:
    """`fn(rank, *args)` on `world_size` spawned ranks in one process group (`backend` "gloo", or "nccl" with rank r
    on GPU r); returns the per-rank results."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    port = store.port
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [
            ctx.Process(target=_rank_main, args=(rank, world_size, port, out_dir, backend, fn, args))
            for rank in range(world_size)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout_s)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        errors = [Path(out_dir, n).read_text() for n in sorted(os.listdir(out_dir)) if n.endswith(".err")]
        if errors or any(proc.exitcode != 0 for proc in procs):
            raise RuntimeError(f"a rank failed (exit codes {[p.exitcode for p in procs]}):\n" + "\n".join(errors))
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
