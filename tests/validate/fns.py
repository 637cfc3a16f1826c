"""A user metric for ``--metric tests.validate.fns:error_rate``."""


def error_rate(outputs, labels) -> float:
    return float((outputs.argmax(1) != labels).float().mean())


error_rate.higher_is_better = False
error_rate.percent = True


def broken(outputs, labels) -> float:
    raise ValueError("this metric is broken on purpose")
