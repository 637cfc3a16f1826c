"""The one report stack of ``ptopt validate`` and ``ptopt optimize``.

Shared by both: ``common`` (the vocabulary: one spelling of every number, the machine and versions
lines, the timing-noise mark and footnotes; the noise rule itself is ``ptopt.validate.noise``), the
format primitives at the top of ``markdown``, ``html`` (page shell, CSS, tables, embedded PNG plots)
and ``terminal``, and ``json_report`` (the atomic JSON writer). Validate's reports, each rendered from
its JSON report dict (so a stored ``--json`` can be re-rendered; read through ``facts``): ``terminal``
(rich table), ``json_report``, ``junit`` (CI test results), ``markdown`` (pull-request comment),
``html`` (self-contained, plots embedded). Optimize's are ``ptopt.optimize.report``, over the same
primitives.
"""
