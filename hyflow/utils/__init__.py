"""Small helpers under the module names verl users know: `tensordict_utils` (a TensorDict as a whole batch; its
parts are `tensordict_columns`, `tensordict_rows` and `nested_tensors`), `metric` (metrics that know how they
combine), `device` (CUDA or CPU, and the matching torch.distributed backend)."""
