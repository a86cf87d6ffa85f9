"""The paper's parts: one module per figure or table, named by it, and how they run.

- :mod:`.parts`: :class:`~.parts.Part` (what a part is: a job with a report
  section) and :data:`~.parts.PARTS`, the registry (``mptlml reproduce NAME``
  -> module);
- one module per part: :mod:`.fig1_convergence` (Fig. 1, Table 1),
  :mod:`.fig2_training`, :mod:`.fig3_vae`, :mod:`.fig4_area`,
  :mod:`.fig5_curve_evolution` (Fig. 5 left), :mod:`.table2_bert` (Table 2,
  Fig. 5 right), and beyond the paper :mod:`.antibody`, :mod:`.model_selection`,
  :mod:`.mlm_training`; their private helpers start with ``_``;
- :mod:`.claims`: a claim and its status; the packaged full-size outcomes
  (:mod:`.full_size` publishes them);
- :mod:`.driver`: :func:`run_part` (one part into a run directory) and
  :func:`run_all`.

Library modules (training, estimators, selection, models) never import this
package; :mod:`mptlml.report` and the command line do.
"""

from __future__ import annotations

from .driver import run_all, run_part
from .parts import PARTS, Part, get_part

__all__ = ["PARTS", "Part", "get_part", "run_all", "run_part"]
