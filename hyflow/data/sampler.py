"""A resumable prompt loader: the sampler's position is saved with checkpoints, so a resumed run sees the next
batch it would have seen.

    loader = build_dataloader(dataset, config.data, train=True)
    loader = build_prompt_loader(config.data.train_files, tokenizer, config.data, train=True)  # from the files
    for batch in loader: ...                    # dict of tensors / object arrays (see hyflow.data.collate)
    state = loader.state_dict()                 # {"epoch", "samples_seen", ...}: save it with the checkpoint
    loader.load_state_dict(state)               # after a restart: continue with the next batch

The order of epoch e is a permutation drawn from `seed + e`, so it does not depend on how many times the process
was restarted. The position counts batches handed to the caller, not indices prefetched by loader workers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hyflow.config.data import DataConfig
from hyflow.data.collate import collate_fn
from hyflow.data.dataset import RLHFDataset

logger = logging.getLogger(__name__)


class ResumableSampler(Sampler[int]):
    """Yields the indices of epoch `epoch` from position `start` on (shuffled by `seed + epoch` when `shuffle`)."""

    def __init__(self, num_samples: int, shuffle: bool, seed: int) -> None:
        self.num_samples, self.shuffle, self.seed = num_samples, shuffle, seed
        self.epoch, self.start = 0, 0

    def epoch_order(self, epoch: int) -> list[int]:
        """The order of all indices in `epoch`."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_order(self.epoch)[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


class StatefulDataLoader:
    """A `torch.utils.data.DataLoader` over a `ResumableSampler` that remembers how far the caller got.

    `len(loader)` is the number of batches in a full epoch. A new `iter(loader)` continues the current epoch from
    the saved position; once an epoch is exhausted the next `iter` starts the following epoch.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool,
        seed: int,
        num_workers: int = 0,
        drop_last: bool = True,
    ) -> None:
        assert isinstance(dataset, Sized)
        if not batch_size > 0:
            raise ValueError(f"batch_size={batch_size} must be positive.")
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.sampler = ResumableSampler(len(dataset), shuffle, seed)
        self._loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            drop_last=drop_last,
        )
        self.epoch, self.samples_seen = 0, 0

    def __len__(self) -> int:
        num_samples = self.sampler.num_samples
        return num_samples // self.batch_size if self.drop_last else -(-num_samples // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.sampler.epoch, self.sampler.start = self.epoch, self.samples_seen
        for batch in self._loader:
            # counted before the caller sees the batch: a checkpoint saved while it trains resumes after it
            self.samples_seen += len(next(iter(batch.values())))
            yield batch
        self.epoch, self.samples_seen = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """The position to save with a checkpoint."""
        return {
            "epoch": self.epoch,
            "samples_seen": self.samples_seen,
            "num_samples": self.sampler.num_samples,
            "seed": self.sampler.seed,
            "shuffle": self.sampler.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; a dataset of another size or another seed restarts the epoch."""
        same_data = (state.get("num_samples"), state.get("seed"), state.get("shuffle")) == (
            self.sampler.num_samples,
            self.sampler.seed,
            self.sampler.shuffle,
        )
        self.epoch = int(state["epoch"])
        self.samples_seen = int(state["samples_seen"]) if same_data else 0
        if not same_data:
            logger.warning(
                "dataloader state was saved for %s prompts (seed %s, shuffle %s), this dataset has %s (seed %s, "
                "shuffle %s): resuming at the start of epoch %d",
                state.get("num_samples"),
                state.get("seed"),
                state.get("shuffle"),
                self.sampler.num_samples,
                self.sampler.seed,
                self.sampler.shuffle,
                self.epoch,
            )


def build_dataloader(dataset: Dataset, config: DataConfig, train: bool) -> StatefulDataLoader:
    """The training loader (`train_batch_size`, `shuffle`, drops the last partial batch) or the validation loader
    (`val_batch_size`, default the whole set in one batch; `validation_shuffle`; keeps every row)."""
    assert isinstance(dataset, Sized)
    if train:
        batch_size, shuffle = config.train_batch_size, config.shuffle
        if batch_size > len(dataset):
            raise ValueError(
                f"data.train_batch_size={batch_size} is larger than the training set ({len(dataset)} prompts); "
                "lower train_batch_size or add data."
            )
    else:
        batch_size, shuffle = config.val_batch_size or len(dataset), config.validation_shuffle
    return StatefulDataLoader(
        dataset, batch_size, shuffle, config.seed, num_workers=config.dataloader_num_workers, drop_last=train
    )


def build_prompt_loader(
    files: Any, tokenizer: Any, config: DataConfig, train: bool, processor: Any = None
) -> StatefulDataLoader:
    """The prompts of `files` as an `RLHFDataset` (at most `train_max_samples` / `val_max_samples` rows) in the
    training or the validation loader (`build_dataloader`)."""
    if not files:
        raise ValueError(
            f"data.{'train' if train else 'val'}_files is not set: give a parquet file in the verl schema (e.g. from "
            "`hyflow prepare-data arith --output data/arith`), or run `hyflow demo`."
        )
    max_samples = config.train_max_samples if train else config.val_max_samples
    dataset = RLHFDataset(files, tokenizer, config, processor=processor, max_samples=max_samples)
    return build_dataloader(dataset, config, train=train)
