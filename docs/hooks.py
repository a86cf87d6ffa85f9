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


#: reStructuredText's escaped space joins a role to the text after it (``:meth:`observe`\ s``);
#: Markdown leaves the backslash and the space: drop them
_RST_JOIN = re.compile(r"(</code>(?:</autoref>)?)\\ ")


#: reStructuredText's ``text::`` introduces a literal block and shows as ``text:``
_RST_LITERAL = re.compile(r"(?<![\s:])::</p>")

#: inside a parameter's type (shown as code) a role or a literal stays as written,
#: ``:class:`Monitor``` or ````(K_q,)````: on an API page, the name or the text alone
_RAW_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<tilde>~?)"
                       r"(?P<target>[^`<]+)`")
_RAW_LITERAL = re.compile(r"``(?P<text>[^`<]+?)``")

#: a class's "Bases:" line: the private bases (``_Result``) are an implementation detail
_BASES = re.compile(r'(?P<open><p class="doc doc-class-bases">\s*Bases:)\s*(?P<bases>.*?)</p>',
                    re.DOTALL)
_CODE = re.compile(r"<code>.*?</code>", re.DOTALL)


def _public_bases(match: re.Match[str]) -> str:
    """The "Bases:" line without its private bases (none left: no line)."""
    keep = [c for c in _CODE.findall(match["bases"])
            if not re.sub(r"<[^>]+>", "", c).strip().rsplit(".", 1)[-1].startswith("_")]
    return f"{match['open']} {', '.join(keep)}</p>" if keep else ""


def _raw_role(match: re.Match[str]) -> str:
    target = match["target"].strip()
    return target.rsplit(".", 1)[-1] if match["tilde"] else target.lstrip(".")


#: names a package provides lazily (a module ``__getattr__``), which the docs' static
#: analysis cannot see: a reference to them goes to where they are defined
_LAZY = {"mptlml.hf.MPTTrainer": "mptlml.hf.trainer.MPTTrainer",
         # the function, which the docs' static analysis confuses with its module
         "mptlml.compare": "mptlml.estimators.compare.compare"}


def _replace(match: re.Match[str], package: str | None) -> str:
    target = match["target"].strip()
    shown = target.rsplit(".", 1)[-1] if match["tilde"] else target.lstrip(".")
    if "." in target and not target.startswith("."):
        identifier = _LAZY.get(target, target)
    elif package is not None and "." not in target:  # a bare name on an API page: its package
        identifier = _LAZY.get(f"{package}.{target}", f"{package}.{target}")
    else:
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """Rewrite the roles of one rendered page (before autorefs resolves its references)."""
    package = page.meta.get("package")  # an API page's front matter: the package it documents
    html = _ROLE.sub(lambda m: _replace(m, package), html)
    html = _RST_JOIN.sub(r"\1", html)
    if package is not None:  # an API page: no raw reStructuredText in the types, no private bases
        html = _RAW_LITERAL.sub(r"\g<text>", _RAW_ROLE.sub(_raw_role, html))
        html = _BASES.sub(_public_bases, html)
    return _RST_LITERAL.sub(":</p>", html)
