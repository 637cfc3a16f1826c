"""Validation: runners (one per artifact format), metrics, latency, gates and reports.

``ptopt.validate(reference, artifacts, data=...)`` calls ``ptopt.validate.api.validate``.
"""

from ptopt.core.callable_module import make_callable

make_callable(__name__, "ptopt.validate.api:validate")
