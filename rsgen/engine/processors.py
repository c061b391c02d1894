"""Processors without their video part, for machines without torchvision.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL and SmolVLM processors take a video processor, and every video processor needs
torchvision, so `AutoProcessor` fails on a CPU machine that (rightly) has none. rsgen only sends images, so
a subclass that drops the video processor does the whole job. The subclass keeps the base class's name, so a
processor it saves records e.g. `"processor_class": "Qwen2VLProcessor"` and loads normally (video included)
on a machine that has torchvision.
"""

from __future__ import annotations

import functools
import inspect

VIDEO_ATTRIBUTE = "video_processor"


def needs_video_processor(processor_class: type) -> bool:
    """Whether `processor_class` takes a video processor (and so needs torchvision to load)."""
    return VIDEO_ATTRIBUTE in processor_class.get_attributes()


@functools.cache
def processor_class_without_video(base: type) -> type:
    """A subclass of the processor class `base` that takes no video processor and keeps `base.__name__`.

    `ProcessorMixin` finds a processor's parts from the parameter names of `__init__`, and passes saved
    settings (e.g. SmolVLM's `image_seq_len`) only to parameters `__init__` names explicitly, so the subclass's
    `__init__` is generated with the base's parameters minus `video_processor`, and forwards them.
    """
    if not needs_video_processor(base):
        return base
    parameters = [
        parameter
        for name, parameter in inspect.signature(base.__init__).parameters.items()
        if name != "self" and name != VIDEO_ATTRIBUTE
    ]
    positional = [p for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if any(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.KEYWORD_ONLY) for p in parameters):
        raise TypeError(f"{base.__name__}.__init__ has a signature rsgen cannot mirror without its video processor")

    defaults = {p.name: p.default for p in positional if p.default is not inspect.Parameter.empty}
    signature = ", ".join(
        f"{p.name}=_defaults[{p.name!r}]" if p.name in defaults else p.name for p in positional
    )
    forwarded = ", ".join(f"{p.name}={p.name}" for p in positional)
    source = (
        f"def __init__(self, {signature}, **kwargs):\n"
        f"    _base.__init__(self, {forwarded}, {VIDEO_ATTRIBUTE}=None, **kwargs)\n"
    )
    namespace = {"_base": base, "_defaults": defaults}
    exec(compile(source, f"<rsgen {base.__name__} without video>", "exec"), namespace)  # noqa: S102
    init = namespace["__init__"]
    init.__doc__ = f"{base.__name__} without a video processor (no torchvision needed)."

    def keep_video_settings(processor, processor_dict):
        # Keep the checkpoint's own video settings so that saving does not lose them.
        target = processor[0] if isinstance(processor, tuple) else processor
        saved = processor_dict.get(VIDEO_ATTRIBUTE)
        target.saved_video_processor_config = saved if isinstance(saved, dict) else None
        return processor

    # transformers >= 5.25 builds a loaded processor with `from_dict`; earlier releases with `from_args_and_dict`.
    @classmethod
    def from_dict(cls, processor_dict, **kwargs):
        return keep_video_settings(base.from_dict.__func__(cls, processor_dict, **kwargs), processor_dict)

    overrides = {"from_dict": from_dict}
    if hasattr(base, "from_args_and_dict"):

        @classmethod
        def from_args_and_dict(cls, args, processor_dict, **kwargs):
            loaded = base.from_args_and_dict.__func__(cls, args, processor_dict, **kwargs)
            return keep_video_settings(loaded, processor_dict)

        overrides["from_args_and_dict"] = from_args_and_dict

    def to_dict(self):
        output = base.to_dict(self)
        output[VIDEO_ATTRIBUTE] = video_processor_config(self)
        return output

    return type(
        base.__name__,
        (base,),
        {
            "__init__": init,
            **overrides,
            "to_dict": to_dict,
            "saved_video_processor_config": None,
            "__module__": __name__,
            "__qualname__": base.__name__,
            "__doc__": init.__doc__,
        },
    )


def video_processor_config(processor) -> dict:
    """The video processor settings to save with a processor that has none loaded.

    The checkpoint's own settings when it had them; otherwise the image processor's (the video processors of
    these models share the image processor's patching and normalisation). Without `image_processor_type`,
    `AutoVideoProcessor` picks the video processor class from the model's `config.json`, next to which a
    processor is saved (a Qwen3-VL checkpoint uses Qwen2-VL's image processor but its own video processor).
    """
    saved = getattr(processor, "saved_video_processor_config", None)
    if saved:
        return dict(saved)
    derived = processor.image_processor.to_dict()
    derived.pop("image_processor_type", None)
    return derived
