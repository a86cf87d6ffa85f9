"""Data: text loaders and the bundled antibody sequences."""

from .text import GLUE_FIELDS, TextData, bundled_antibodies, load_texts

__all__ = ["GLUE_FIELDS", "TextData", "bundled_antibodies", "load_texts"]
