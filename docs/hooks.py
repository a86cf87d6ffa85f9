"""MkDocs hook: reStructuredText roles in docstrings become code, linked when they resolve.

The package's numpydoc docstrings cross-reference with Sphinx roles
(``:class:`~mptlml.models.PPCA```), which Markdown renders literally as
``:class:<code>~mptlml.models.PPCA</code>``. This hook rewrites each one into
the name in code, as Sphinx shows it (``~`` keeps the last component), wrapped
in an optional cross-reference that mkdocs-autorefs turns into a link when the
target is documented on the site and leaves as plain code otherwise.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(?P<tilde>~?)(?P<target>[^<]+?)</code>"
)


def _replace(match: re.Match[str], package: str | None) -> str:
    target = match["target"].strip()
    shown = target.rsplit(".", 1)[-1] if match["tilde"] else target.lstrip(".")
    if "." in target and not target.startswith("."):
        identifier = target
    elif package is not None and "." not in target:  # a bare name on an API page: its package
        identifier = f"{package}.{target}"
    else:
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """Rewrite the roles of one rendered page (before autorefs resolves its references)."""
    src = page.file.src_uri  # api/estimators.md documents mptlml.estimators
    stem = src.removeprefix("api/").removesuffix(".md") if src.startswith("api/") else None
    package = None if stem in (None, "index") else (
        "mptlml" if stem == "mptlml" else f"mptlml.{stem}")
    return _ROLE.sub(lambda m: _replace(m, package), html)
