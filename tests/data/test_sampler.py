"""The resumable loader: seeded order, full epochs, and a resumed run seeing the next batch it would have seen."""

import pytest
import torch
from torch.utils.data import Dataset

from hyflow.config.data import DataConfig
from hyflow.data.sampler import StatefulDataLoader, build_dataloader


class Numbers(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i]), "index": i}


def _indices(batch):
    return batch["input_ids"].squeeze(1).tolist()


def test_an_epoch_visits_every_row_once_in_a_seeded_order():
    first = [_indices(b) for b in StatefulDataLoader(Numbers(12), 4, shuffle=True, seed=3)]
    again = [_indices(b) for b in StatefulDataLoader(Numbers(12), 4, shuffle=True, seed=3)]
    other = [_indices(b) for b in StatefulDataLoader(Numbers(12), 4, shuffle=True, seed=4)]
    assert first == again and first != other
    assert sorted(i for batch in first for i in batch) == list(range(12))


def test_each_epoch_has_its_own_order_and_drop_last_drops_the_partial_batch():
    loader = StatefulDataLoader(Numbers(10), 4, shuffle=True, seed=0)
    assert len(loader) == 2
    epoch0 = [_indices(b) for b in loader]
    epoch1 = [_indices(b) for b in loader]
    assert len(epoch0) == len(epoch1) == 2 and epoch0 != epoch1
    assert loader.state_dict()["epoch"] == 2


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_resumed_loader_yields_the_batch_the_first_run_would_have_seen(num_workers):
    reference = StatefulDataLoader(Numbers(20), 3, shuffle=True, seed=1)
    expected = [_indices(b) for b in reference] + [_indices(b) for b in reference]

    first_run = StatefulDataLoader(Numbers(20), 3, shuffle=True, seed=1, num_workers=num_workers)
    seen = [_indices(b) for b in first_run]  # one full epoch
    iterator = iter(first_run)
    seen += [_indices(next(iterator)) for _ in range(2)]  # two batches into the second epoch, then "crash"
    state = first_run.state_dict()

    resumed = StatefulDataLoader(Numbers(20), 3, shuffle=True, seed=1, num_workers=num_workers)
    resumed.load_state_dict(state)
    rest = [_indices(b) for b in resumed]
    assert seen + rest == expected


def test_state_for_a_different_dataset_restarts_the_epoch():
    loader = StatefulDataLoader(Numbers(8), 2, shuffle=False, seed=0)
    loader.load_state_dict({"epoch": 1, "samples_seen": 4, "num_samples": 99, "seed": 0, "shuffle": False})
    assert _indices(next(iter(loader))) == [0, 1]


def test_build_dataloader_uses_train_and_validation_settings():
    config = DataConfig(train_batch_size=4, val_batch_size=None, shuffle=True, validation_shuffle=False)
    train = build_dataloader(Numbers(10), config, train=True)
    val = build_dataloader(Numbers(10), config, train=False)
    assert len(train) == 2 and len(val) == 1
    assert _indices(next(iter(val))) == list(range(10))


def test_a_train_batch_larger_than_the_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="train_batch_size=64"):
        build_dataloader(Numbers(10), DataConfig(train_batch_size=64), train=True)
