"""Validation: its options (``options``), metrics, latency, gates, reports, the language-model path
(``lm``) and the opening of runners (``runners``: each format's own runner is its row's, in
``ptopt.formats``; ``runners.compiled`` adds ``torch.compile``).

``ptopt.validate(reference, artifacts, data=...)`` calls ``ptopt.validate.api.validate``.
"""

from ptopt.core.callable_module import make_callable

make_callable(__name__, "ptopt.validate.api:validate")
