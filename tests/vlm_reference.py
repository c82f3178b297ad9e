"""The naive reference the vision-language training paths are checked against: each row alone through the plain
Hugging Face model with its own images and videos, full logits, log-softmax, gather."""

import torch
from transformers import AutoModelForImageTextToText

from hyflow import fields as F
from hyflow.models.multimodal import mm_token_type_ids


def plain_transformers_log_probs(path, data) -> torch.Tensor:
    """(B, R) log-probs of `data`'s responses (0 past each response's end), row by row, from the model at `path`."""
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    response_length = data.batch[F.RESPONSES].shape[1]
    rows = []
    for i in range(len(data)):
        mask = data.batch[F.ATTENTION_MASK][i].bool()
        input_ids = data.batch[F.INPUT_IDS][i][mask][None]
        inputs = data.non_tensor_batch[F.MULTI_MODAL_INPUTS][i]
        with torch.no_grad():
            out = model(input_ids=input_ids, mm_token_type_ids=mm_token_type_ids(input_ids, model.config), **inputs)
        logits = out.logits[0]
        response = data.batch[F.RESPONSES][i]
        num_tokens = int(mask[-response_length:].sum())
        lp = torch.log_softmax(logits[-num_tokens - 1 : -1].float(), -1).gather(-1, response[:num_tokens, None])
        rows.append(torch.nn.functional.pad(lp[:, 0], (0, response_length - num_tokens)))
    return torch.stack(rows)
