"""Abstract Resource View: logical tensor specs and the view function. Pure metadata."""

from liver.resource_view.spec import TensorSpec
from liver.resource_view.view import Box, box_numel, full_box, intersect, local_shape, relative, view

__all__ = ["Box", "TensorSpec", "box_numel", "full_box", "intersect", "local_shape", "relative",
           "view"]
