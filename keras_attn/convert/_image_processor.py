"""What a Hugging Face image processor (`preprocessor_config.json`) does to
pixels, as the fields of a keras_attn `ViT`, and back: one reader and one
writer for every image family (ViT, DINOv2 with registers).

keras_attn's ViT takes raw `(B, H, W, C)` pixels in [0, 255] at its
`image_size` and rescales and normalises them in its first layer; the
processor's `do_rescale` / `rescale_factor` / `do_normalize` / `image_mean` /
`image_std` become that layer (`pixel_normalization`, or `"custom"` with
`pixel_mean` / `pixel_std` in the input's units), so the model's answer on
raw images equals transformers' processor + model on the same images.

The processor's geometry (`do_resize`, `size`, `resample`, `do_center_crop`,
`crop_size`) is not in the model: it takes images of its own size only. The
size the processor gives its model is read (`ImageProcessing.size`) so a
loader can check it or build the model at that size; images of another size
must be resized and cropped as the processor says before they go in.
`do_convert_rgb` converts PIL images of other modes (grey, RGBA) to RGB; an
array with the model's channels is what it gives.
"""

import dataclasses
import math
import numbers
import os

from keras_attn.convert._checkpoint import read_config
from keras_attn.models.vit.vit_config import PIXEL_STATISTICS

PREPROCESSOR = "preprocessor_config.json"

# transformers' defaults of the processors read here: (image_mean, image_std)
# on [0, 1], whether they center-crop, and the default `size`.
_HALF = PIXEL_STATISTICS["half"]
_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_SQUARE = {"height": 224, "width": 224}
_PROCESSORS = {
    "ViTImageProcessor": (_HALF, False, _SQUARE),
    "BitImageProcessor": (_CLIP, True, {"shortest_edge": 224}),
}
# The names a directory may give them (the NumPy/PIL and torchvision
# implementations compute the same; "ViTFeatureExtractor" is the old name).
_ALIASES = {name + suffix: name for name in _PROCESSORS for suffix in ("", "Fast", "Pil")}
_ALIASES["ViTFeatureExtractor"] = "ViTImageProcessor"


@dataclasses.dataclass(frozen=True)
class ImageProcessing:
    """`fields`: the `ViTConfig` fields of the pixel normalisation;
    `size`: the side of the square images the processor gives its model
    (None where it does not fix one: no resize, or an aspect-preserving one
    without a crop); `key`: the processor key `size` comes from."""

    fields: dict
    size: int = None
    key: str = None


def _refuse(key, value, why):
    raise ValueError(f"{PREPROCESSOR}: {why}. Received: {key}={value!r}")


def _flag(processor, key, default):
    value = processor.get(key, default)
    if not isinstance(value, bool):
        _refuse(key, value, f"{key!r} must be true or false")
    return value


def _number(value):
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def _per_channel(processor, key, default, num_channels, positive):
    value = processor.get(key, default)
    values = list(value) if isinstance(value, (list, tuple)) else [value] * num_channels
    if not values or not all(_number(v) and (v > 0 or not positive) for v in values):
        _refuse(key, value, f"{key!r} must be a {'positive ' if positive else ''}number "
                            "or a list of one per channel")
    if len(values) != num_channels:
        _refuse(key, value, f"{key!r} must have one number per channel of the model "
                            f"(config.json num_channels={num_channels})")
    return [float(v) for v in values]


def _square(processor, key, default):
    """The side of `processor[key]`, {"height": h, "width": w} or an integer
    (square: ViT's `size`, a `crop_size`), or None for {"shortest_edge": n}
    or an integer Bit `size` (the aspect kept); anything else refused."""
    value = processor.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            _refuse(key, value, f"{key!r} must be positive")
        return None if default == {"shortest_edge": 224} else value
    if isinstance(value, dict) and set(value) == {"height", "width"}:
        height, width = value["height"], value["width"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                   for v in (height, width)):
            _refuse(key, value, "the height and width must be positive integers")
        if height != width:
            _refuse(key, value, "keras_attn's ViT takes square images")
        return height
    if isinstance(value, dict) and set(value) == {"shortest_edge"}:
        return None
    _refuse(key, value, f"{key!r} must be {{'height': h, 'width': w}}, "
                        "{'shortest_edge': n} or an integer")


def read_image_processor(directory, num_channels, default_type, default_normalization):
    """The `ImageProcessing` of `<directory>/preprocessor_config.json`.

    Args:
        directory: the Hugging Face directory.
        num_channels: the model's channels (`config.json`).
        default_type: the processor class of a file that names none
            (`"ViTImageProcessor"`, `"BitImageProcessor"`).
        default_normalization: the `pixel_normalization` without the file.

    Raises:
        ValueError: naming the file, the key and the value, for a processor
            class other than ViT's or Bit's, a malformed value, statistics
            that are not one per channel, or a non-square output size.
    """
    if not os.path.exists(os.path.join(directory, PREPROCESSOR)):
        return ImageProcessing({"pixel_normalization": default_normalization})
    processor = read_config(directory, PREPROCESSOR)
    key = "image_processor_type" if "image_processor_type" in processor else (
        "feature_extractor_type")
    kind = processor.get(key, default_type)
    if kind not in _ALIASES:
        _refuse(key, kind, f"keras_attn follows {sorted(_PROCESSORS)} only (another "
                           "processor may prepare pixels in ways the model does not)")
    (mean, std), crops, size = _PROCESSORS[_ALIASES[kind]]
    mean = _per_channel(processor, "image_mean", mean, num_channels, positive=False)
    std = _per_channel(processor, "image_std", std, num_channels, positive=True)
    factor = processor.get("rescale_factor", 1 / 255)
    if not _number(factor) or factor <= 0:
        _refuse("rescale_factor", factor, "'rescale_factor' must be a positive number")
    factor = float(factor) if _flag(processor, "do_rescale", True) else 1.0
    if not _flag(processor, "do_normalize", True):
        mean, std = [0.0] * num_channels, [1.0] * num_channels
    # (x * factor - mean) / std = (x - mean / factor) / (std / factor).
    fields = {"pixel_normalization": "custom",
              "pixel_mean": tuple(m / factor for m in mean),
              "pixel_std": tuple(s / factor for s in std)}
    for name, (known_mean, known_std) in PIXEL_STATISTICS.items():
        known = [known_mean[0]] * num_channels if name == "half" else list(known_mean)
        known_std = [known_std[0]] * num_channels if name == "half" else list(known_std)
        if (abs(factor * 255 - 1) < 1e-9 and len(known) == num_channels
                and all(abs(a - b) < 1e-6 for a, b in zip(mean + std, known + known_std))):
            fields = {"pixel_normalization": name}
    if crops and _flag(processor, "do_center_crop", True):
        return ImageProcessing(fields, _square(processor, "crop_size", _SQUARE), "crop_size")
    if _flag(processor, "do_resize", True):
        return ImageProcessing(fields, _square(processor, "size", size), "size")
    return ImageProcessing(fields)


def check_image_size(processing, image_size, argument):
    """Refuses a processor whose images are not `image_size` square (the
    model takes no other size): named by file, key and value."""
    if processing.size is not None and processing.size != image_size:
        raise ValueError(
            f"{PREPROCESSOR}: the processor gives the model {processing.size} x "
            f"{processing.size} images; keras_attn's ViT takes {argument}={image_size} "
            f"square ones only. Received: {processing.key}="
            f"{{'height': {processing.size}, 'width': {processing.size}}}")


def processor_statistics(config):
    """The `image_mean` and `image_std` (on [0, 1], after the 1 / 255
    rescale) that a processor needs to give the pixels a `ViTConfig`'s first
    layer computes."""
    if config.pixel_normalization == "custom":
        return ([m / 255 for m in config.pixel_mean], [s / 255 for s in config.pixel_std])
    mean, std = PIXEL_STATISTICS[config.pixel_normalization]
    if config.pixel_normalization == "half":
        return [mean[0]] * config.num_channels, [std[0]] * config.num_channels
    return list(mean), list(std)
