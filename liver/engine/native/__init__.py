"""Bring your own model: a user's PyTorch-native training (DTensor, FSDP2, tensor parallel, pipeline
stages) behind the runtime's adapter interface. ``Recipe`` is the public API (recipe.py), with the
user's own loop over ``NativeStep``s (step.py); ``NativeAdapter`` (adapter.py) puts one behind
``EngineAdapter``; the Resource View comes from DTensor placements (resource.py); ``NativeEngine``
(engine.py) is one rank of such a job."""

from liver.engine.native.recipe import Recipe, clip_grad_norm
from liver.engine.native.step import NativeStep

__all__ = ["NativeStep", "Recipe", "clip_grad_norm"]
