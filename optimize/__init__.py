"""``ptopt optimize``: search techniques, formats and runtimes for the fastest artifact within an
accuracy budget, on this machine.

- ``api``: ``optimize(...)`` and ``OptimizeResult``;
- ``candidates``: the catalogue (each candidate built by the stages' own functions);
- ``search``: ordering, the accuracy pre-screen, interleaved timing, the time budget;
- ``report``: report.json / report.html / summary.md and the terminal table, over validate's report
  stack (``ptopt.validate.reports``); ``pareto``: the Pareto plot of report.html.

Imports no torch.
"""

from ptopt.core.callable_module import make_callable

make_callable(__name__, "ptopt.optimize.api:optimize")
