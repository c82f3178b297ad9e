"""`image_zoom_in_tool`: crop one of the prompt's images to a box and return the crop, enlarged, as a new image.

The model sees the crop as an image input of the next turn (a vision-language model's tool agent loop; see
`hyflow.agent.vision`), so it can look closer at a region of a figure. The box is in pixels of the original image,
`[x1, y1, x2, y2]` (left, top, right, bottom; Qwen2.5-VL's absolute `bbox_2d` convention), clipped to the image;
the crop is scaled so that its shorter side is at least `min_side` pixels (never beyond `max_side` on its longer
side), so a small region still spans several vision patches.

    tools:
      - class_name: image_zoom          # or hyflow.agent.tools.image_zoom.ImageZoomTool
        config: {min_side: 56, max_side: 448}

The prompt's images reach the tool through `create(image_data=[...])` (the loop passes them, `takes_images`), or,
as in verl, through the sample's `tools_kwargs.image_zoom_in_tool.create_kwargs.image` (one image).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from hyflow.agent.tools.base import BaseTool, ToolConfig, ToolResponse
from hyflow.agent.vision import tool_images

SCHEMA = {
    "type": "function",
    "function": {
        "name": "image_zoom_in_tool",
        "description": (
            "Zoom in on a region of an image: crop it to a bounding box [x1, y1, x2, y2] in pixels (left, top, "
            "right, bottom) and see the region enlarged."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "bbox_2d": {
                    "type": "array",
                    "items": {"type": "number"},
                    "description": "The region as [x1, y1, x2, y2] in pixels of the original image.",
                },
                "image_index": {"type": "integer", "description": "Which of the prompt's images (default 0)."},
                "label": {"type": "string", "description": "What the region shows (optional)."},
            },
            "required": ["bbox_2d"],
        },
    },
}


@dataclass
class ImageZoomConfig(ToolConfig):
    min_side: int = 56  # the crop's shorter side is scaled up to at least this many pixels
    max_side: int = 448  # ... but its longer side never beyond this


def crop_box(size: tuple[int, int], box: Any) -> tuple[int, int, int, int]:
    """`box` = [x1, y1, x2, y2] rounded and clipped to an image of `size` (width, height); ValueError if it is
    not four numbers or holds no pixel of the image."""
    if not isinstance(box, (list, tuple)) or len(box) != 4 or not all(isinstance(v, (int, float)) for v in box):
        raise ValueError(f"bbox_2d={box!r} must be four numbers [x1, y1, x2, y2]")
    width, height = size
    x1, y1 = max(0, round(min(box[0], box[2]))), max(0, round(min(box[1], box[3])))
    x2, y2 = min(width, round(max(box[0], box[2]))), min(height, round(max(box[1], box[3])))
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"bbox_2d={list(box)} holds no pixel of the {width}x{height} image")
    return x1, y1, x2, y2


def zoom(image: Image.Image, box: tuple[int, int, int, int], min_side: int, max_side: int) -> Image.Image:
    """The crop of `image` to `box`, scaled by s = min(max(1, min_side / shorter), max_side / longer)."""
    crop = image.crop(box)
    shorter, longer = min(crop.size), max(crop.size)
    scale = min(max(1.0, min_side / shorter), max_side / longer)
    if scale == 1.0:
        return crop
    return crop.resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))), Image.BICUBIC)


class ImageZoomTool(BaseTool):
    """Crops the prompt's images (see the module docstring)."""

    config_class = ImageZoomConfig
    default_schema = SCHEMA
    takes_images = True

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        images = list(kwargs.pop("image_data", None) or [])
        if kwargs.get("image") is not None:  # verl's create_kwargs
            images = [kwargs.pop("image")]
        return await super().create(instance_id, images=tool_images(images, self.name), **kwargs)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        images = self.instances[instance_id]["images"]
        index = parameters.get("image_index", 0)
        if not isinstance(index, int) or not 0 <= index < len(images):
            raise ValueError(f"image_index={index!r} is not one of the prompt's {len(images)} image(s)")
        image = images[index]
        box = crop_box(image.size, parameters["bbox_2d"])
        crop = zoom(image, box, self.config.min_side, self.config.max_side)
        text = f"Zoomed in on {list(box)} of image {index} ({crop.width}x{crop.height} pixels)."
        return ToolResponse(text=text, image=[crop]), 0.0, {}
