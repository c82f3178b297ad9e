"""RL prompt data: the verl parquet schema, `RLHFDataset`, a resumable loader, and preprocessing.

    from hyflow.data.dataset import RLHFDataset
    from hyflow.data.sampler import build_dataloader
    from hyflow.data.prepare import prepare_task          # also: `hyflow prepare-data TASK --output DIR`

Files: schema.py (row checks), dataset.py (RLHFDataset), collate.py (batching into DataProto-ready dicts),
sampler.py (seeded, resumable loader), preprocess/ (gsm8k, math, arith, countdown), prepare.py (the command).
"""
