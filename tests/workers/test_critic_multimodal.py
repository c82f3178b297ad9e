"""DataParallelPPOCritic on a tiny Qwen2-VL: values see the images and do not depend on the micro-batch cut."""

import pytest
import torch
from transformers import AutoModelForImageTextToText

from hyflow import fields as F
from hyflow.config.critic import CriticConfig
from hyflow.models.loader import load_value_model
from hyflow.workers.critic import DataParallelPPOCritic
from hyflow.workers.micro_batch_loop import ForwardSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("remove_padding", [False, True])
def test_critic_values_on_image_rows_equal_a_plain_forward_of_each_row_with_its_images(
    vlm_path, image_batch, remove_padding
):
    critic = load_value_model(vlm_path)
    if remove_padding:  # packed rows, M-RoPE positions packed alike, varlen attention in the language model
        critic.enable_remove_padding()
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)  # a fresh head predicts 0 everywhere
    worker = DataParallelPPOCritic(CriticConfig(), critic)
    data = image_batch
    values = worker.compute_values(data, ForwardSettings(micro_batch_size=4))
    backbone = AutoModelForImageTextToText.from_pretrained(vlm_path).model.eval()
    response_length = data.batch[F.RESPONSES].shape[1]
    for i in range(len(data)):
        mask = data.batch[F.ATTENTION_MASK][i].bool()
        input_ids = data.batch[F.INPUT_IDS][i][mask][None]
        mm_token_type_ids = (input_ids == backbone.config.image_token_id).long()
        inputs = data.non_tensor_batch[F.MULTI_MODAL_INPUTS][i]
        with torch.no_grad():
            hidden = backbone(input_ids=input_ids, mm_token_type_ids=mm_token_type_ids, **inputs).last_hidden_state
        num_tokens = int(data.batch[F.RESPONSE_MASK][i].sum())
        expected = critic.value_head(hidden[0, -num_tokens - 1 : -1]).squeeze(-1)
        torch.testing.assert_close(values[i, :num_tokens], expected.detach(), rtol=1e-4, atol=1e-5)
        assert not values[i, num_tokens:response_length].any()
