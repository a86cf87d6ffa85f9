"""Data: binarised images (:mod:`.images`), texts and bundled antibodies (:mod:`.text`)."""

from .images import IMAGE_DATASETS, binarize, load_images, read_idx
from .text import GLUE_FIELDS, TextData, bundled_antibodies, load_texts

__all__ = ["GLUE_FIELDS", "IMAGE_DATASETS", "TextData", "binarize", "bundled_antibodies",
           "load_images", "load_texts", "read_idx"]
