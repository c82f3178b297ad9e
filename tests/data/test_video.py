"""Videos in verl's schema: frame lists and GIF files become Qwen2-VL video inputs, pads and M-RoPE positions."""

import io

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from hyflow import fields as F
from hyflow.config.data import DataConfig
from hyflow.data.dataset import RLHFDataset
from hyflow.data.multimodal import image_features
from hyflow.data.video import DEFAULT_FPS, video_features
from hyflow.models.multimodal import mm_token_type_ids
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import VIDEO_PAD, build_tiny_vlm


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="module")
def processor(vlm_path):
    return load_processor(vlm_path)


def frame(color, size=(56, 56)):
    return Image.new("RGB", size, color)


def png(image):
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def gif(frames):
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=100)
    return {"bytes": buffer.getvalue(), "path": None}


def video_row(videos, content="<video>What happens?", images=None):
    return {
        "data_source": "clips",
        "prompt": [{"role": "user", "content": content}],
        "videos": videos,
        **({"images": images} if images is not None else {}),
        "reward_model": {"style": "rule", "ground_truth": "red"},
    }


def load(path, processor):
    return RLHFDataset(path, processor.tokenizer, DataConfig(max_prompt_length=64), processor=processor)


COLORS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


def test_a_video_of_frames_gives_its_grid_and_one_pad_per_merged_patch(write_rows, processor):
    item = load(write_rows([video_row([[png(frame(c)) for c in COLORS]])]), processor)[0]
    inputs = item[F.MULTI_MODAL_INPUTS]
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]  # 4 frames -> 2 temporal patches of 4x4 patches
    assert inputs["pixel_values_videos"].shape[0] == 32
    assert int((item[F.INPUT_IDS] == processor.tokenizer.convert_tokens_to_ids(VIDEO_PAD)).sum()) == 8
    video = item[F.MULTI_MODAL_DATA]["video"][0]
    assert len(video.frames) == 4 and video.fps == DEFAULT_FPS
    assert "second_per_grid_ts" not in inputs  # Qwen2-VL's positions count temporal patches, not seconds


def test_a_gif_file_decodes_to_the_same_inputs_as_its_frames(write_rows, processor, tmp_path):
    frames = [frame(c) for c in COLORS]
    path = tmp_path / "clip.gif"
    path.write_bytes(gif(frames)["bytes"])
    from_frames = load(write_rows([video_row([[png(f) for f in frames]])], "a.parquet"), processor)[0]
    from_file = load(write_rows([video_row([str(path)])], "b.parquet"), processor)[0]
    a, b = from_frames[F.MULTI_MODAL_INPUTS], from_file[F.MULTI_MODAL_INPUTS]
    assert torch.equal(a["video_grid_thw"], b["video_grid_thw"])
    torch.testing.assert_close(a["pixel_values_videos"], b["pixel_values_videos"], atol=0.05, rtol=0)  # GIF palette


def test_a_still_video_has_the_pixels_of_its_frame_as_an_image(processor):
    """An image is its frame repeated over the temporal patch, so two equal frames must give the same patches."""
    still = frame((10, 200, 30))
    video = video_features(processor, [[still, still]])
    image = image_features(processor, [still])
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist()
    torch.testing.assert_close(video["pixel_values_videos"], image["pixel_values"])


def test_an_odd_frame_count_repeats_the_last_frame(processor):
    frames = [frame(c) for c in COLORS[:3]]
    odd = video_features(processor, [frames])
    padded = video_features(processor, [[*frames, frames[-1]]])
    assert odd["video_grid_thw"].tolist() == [[2, 4, 4]]
    torch.testing.assert_close(odd["pixel_values_videos"], padded["pixel_values_videos"])


@pytest.mark.parametrize("num_frames", [4, 8])  # 8 frames: more temporal patches (4) than merged rows (2)
def test_position_ids_of_an_image_and_a_video_row_are_the_models_mrope_rows(
    write_rows, processor, vlm_path, num_frames
):
    frames = [png(frame(COLORS[i % 4])) for i in range(num_frames)]
    row = video_row([frames], content="<image>then<video>?", images=[png(frame(COLORS[0]))])
    item = load(write_rows([row]), processor)[0]
    model = AutoModelForImageTextToText.from_pretrained(vlm_path)
    input_ids, mask, inputs = item[F.INPUT_IDS][None], item[F.ATTENTION_MASK][None], item[F.MULTI_MODAL_INPUTS]
    expected, _ = model.model.get_rope_index(
        input_ids,
        mm_token_type_ids(input_ids, model.config),
        inputs["image_grid_thw"],
        inputs["video_grid_thw"],
        attention_mask=mask,
    )
    assert torch.equal(item[F.POSITION_IDS], expected[:, 0])


def test_frames_of_different_sizes_fail_at_load_naming_row_and_column(write_rows, processor):
    row = video_row([[png(frame(COLORS[0])), png(frame(COLORS[1], (84, 56)))]])
    with pytest.raises(ValueError, match=r"row 0, column 'videos': video 0 has frames of sizes"):
        load(write_rows([row]), processor)


def test_a_video_without_its_placeholder_fails_at_load(write_rows, processor):
    row = video_row([[png(frame(COLORS[0]))]], content="What happens?")
    with pytest.raises(ValueError, match=r"0 '<video>' placeholder\(s\) but the row has 1 video\(s\)"):
        load(write_rows([row]), processor)


def test_undecodable_video_bytes_fail_at_load(write_rows, processor):
    row = video_row([{"bytes": b"not a video", "path": None}])
    with pytest.raises(ValueError, match=r"column 'videos': video 0 cannot be decoded"):
        load(write_rows([row]), processor)


@pytest.fixture(scope="module")
def qwen25_path(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-qwen2.5-vl"), arch="qwen2_5_vl")


@pytest.mark.parametrize(
    ("video", "seconds"),
    [
        ([png(frame(c)) for c in COLORS], 2 / DEFAULT_FPS),  # frames at the default 2 fps: 1 s per temporal patch
        ({"video": [png(frame(c)) for c in COLORS], "fps": 4.0}, 0.5),  # verl's form with its frame rate
        (gif([frame(c) for c in COLORS]), 0.2),  # the GIF's 100 ms per frame: 10 fps
    ],
)
def test_qwen25_vl_video_positions_are_scaled_by_seconds_per_temporal_patch_as_the_models(
    write_rows, qwen25_path, video, seconds
):
    processor = load_processor(qwen25_path)
    row = video_row([video], content="<image>then<video>?", images=[png(frame(COLORS[0]))])
    item = load(write_rows([row]), processor)[0]
    model = AutoModelForImageTextToText.from_pretrained(qwen25_path)
    input_ids, mask, inputs = item[F.INPUT_IDS][None], item[F.ATTENTION_MASK][None], item[F.MULTI_MODAL_INPUTS]
    torch.testing.assert_close(inputs["second_per_grid_ts"], torch.tensor([seconds]))
    expected, _ = model.model.get_rope_index(
        input_ids,
        mm_token_type_ids(input_ids, model.config),
        inputs["image_grid_thw"],
        inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"],
        attention_mask=mask,
    )
    assert torch.equal(item[F.POSITION_IDS], expected[:, 0])
    video_rows = item[F.POSITION_IDS][0, item[F.INPUT_IDS] == model.config.video_token_id]
    start, step = video_rows[0].item(), int(model.config.vision_config.tokens_per_second * seconds)
    assert video_rows.unique().tolist() == sorted({start, start + step})  # the second temporal patch, step later


def test_a_video_fps_that_is_not_a_positive_number_fails_at_load(write_rows, processor):
    row = video_row([{"video": [png(frame(COLORS[0]))], "fps": 0.0}])
    with pytest.raises(ValueError, match=r"row 0, column 'videos': video 0 has fps=0.0"):
        load(write_rows([row]), processor)
