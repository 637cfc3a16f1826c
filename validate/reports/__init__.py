"""Reports of a validation run, each rendered from the JSON report dict (so a stored ``--json`` can
be re-rendered): ``terminal`` (rich table), ``json_report``, ``junit`` (CI test results),
``markdown`` (pull-request comment), ``html`` (self-contained, plots embedded)."""
