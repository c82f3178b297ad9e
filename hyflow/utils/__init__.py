"""Small helpers under the module names verl users know: `tensordict_utils` (a TensorDict as a whole batch),
`metric` (metrics that know how they combine), `device` (CUDA or CPU, and the matching torch.distributed backend)."""
