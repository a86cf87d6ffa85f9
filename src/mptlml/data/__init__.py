"""Data: binarised images (:mod:`.images`), texts and bundled antibodies (:mod:`.text`)."""

from .images import (
    IMAGE_DATASETS,
    IMAGE_SOURCES,
    binarize,
    describe_images,
    load_images,
    read_idx,
)
from .text import GLUE_FIELDS, TextData, bundled_antibodies, load_texts

__all__ = ["GLUE_FIELDS", "IMAGE_DATASETS", "IMAGE_SOURCES", "TextData", "binarize",
           "bundled_antibodies", "describe_images", "load_images", "load_texts", "read_idx"]
