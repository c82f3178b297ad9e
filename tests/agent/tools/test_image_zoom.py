"""image_zoom: crops the prompt's image to a box, clipped, enlarged to a minimum side, with clear errors."""

import asyncio
import io
from pathlib import Path

import pytest
from PIL import Image

import hyflow.agent
from hyflow.agent.tools.image_zoom import ImageZoomTool, crop_box, zoom
from hyflow.agent.tools.registry import initialize_tools_from_config


def picture(width=100, height=80):
    image = Image.new("RGB", (width, height), "white")
    image.putpixel((10, 20), (255, 0, 0))
    return image


def run(tool, parameters, **create_kwargs):
    async def episode():
        instance, _ = await tool.create(**create_kwargs)
        return await tool.execute(instance, parameters)

    return asyncio.run(episode())


def test_the_box_is_rounded_ordered_and_clipped_to_the_image():
    assert crop_box((100, 80), [-5, 10.4, 50, 200]) == (0, 10, 50, 80)
    assert crop_box((100, 80), [60, 40, 20, 10]) == (20, 10, 60, 40)


@pytest.mark.parametrize("box", [[1, 2, 3], ["a", 0, 1, 1], [200, 200, 300, 300], [5, 5, 5, 9]])
def test_a_box_that_is_malformed_or_outside_the_image_is_an_error_naming_it(box):
    with pytest.raises(ValueError, match=r"bbox_2d="):
        crop_box((100, 80), box)


def test_a_small_crop_is_enlarged_to_the_minimum_side_and_a_large_one_bounded():
    assert zoom(picture(), (0, 0, 14, 28), min_side=56, max_side=448).size == (56, 112)
    assert zoom(picture(1000, 500), (0, 0, 1000, 500), min_side=56, max_side=448).size == (448, 224)
    assert zoom(picture(), (0, 0, 60, 70), min_side=56, max_side=448).size == (60, 70)


def test_execute_returns_the_crop_as_an_image_with_a_description():
    response, reward, _ = run(ImageZoomTool(), {"bbox_2d": [10, 20, 38, 48]}, image_data=[picture()])
    (crop,) = response.image
    assert crop.size == (56, 56) and crop.getpixel((0, 0)) == (255, 0, 0)
    assert response.text == "Zoomed in on [10, 20, 38, 48] of image 0 (56x56 pixels)." and reward == 0.0


def test_verl_style_create_kwargs_give_the_image_as_bytes():
    buffer = io.BytesIO()
    picture().save(buffer, format="PNG")
    response, _, _ = run(ImageZoomTool(), {"bbox_2d": [0, 0, 100, 80]}, image={"bytes": buffer.getvalue()})
    assert response.image[0].size == (100, 80)


def test_a_missing_image_index_is_an_error():
    with pytest.raises(ValueError, match=r"image_index=1 is not one of the prompt's 1 image"):
        run(ImageZoomTool(), {"bbox_2d": [0, 0, 5, 5], "image_index": 1}, image_data=[picture()])


def test_the_example_tool_config_loads_the_zoom_tool_with_its_openai_schema():
    path = Path(hyflow.agent.__file__).parent / "configs" / "image_zoom_tool.yaml"
    (tool,) = initialize_tools_from_config(path)
    assert isinstance(tool, ImageZoomTool) and tool.takes_images
    assert tool.tool_schema.function.name == "image_zoom_in_tool"
    assert tool.tool_schema.function.parameters.required == ["bbox_2d"]
    assert tool.config.min_side == 56 and tool.config.timeout == 10
