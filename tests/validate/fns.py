"""A user metric for ``--metric tests.validate.fns:error_rate``."""


def error_rate(outputs, labels) -> float:
    return float((outputs.argmax(1) != labels).float().mean())


error_rate.higher_is_better = False
error_rate.percent = True


def broken(outputs, labels) -> float:
    raise ValueError("this metric is broken on purpose")


def picky():
    """A model that takes at most 2 samples per batch: passes the probe, fails the accuracy pass."""
    import torch

    from tests.helpers import tiny_cnn

    class Picky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tiny_cnn()

        def forward(self, x):
            if x.shape[0] > 2:
                raise RuntimeError(f"batch {x.shape[0]} is too large")
            return self.inner(x)

    return Picky()


#: how many times ``breaks_after_first_load`` made a model
LOADS = {"count": 0}


def breaks_after_first_load():
    """A model that runs when first loaded (the probe) and fails on every call after any later load:
    a runtime failure that smaller batches do not avoid."""
    import torch

    from tests.helpers import tiny_cnn

    LOADS["count"] += 1
    broken = LOADS["count"] > 1

    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tiny_cnn()

        def forward(self, x):
            if broken:
                raise RuntimeError("the kernel crashed")
            return self.inner(x)

    return Breaks()


def dies_at_avx():
    """The tiny CNN, except that its process dies (SIGSEGV, as a crash in a kernel library would) when it
    runs under the oneDNN cap of the ``avx`` CPU level: ``validate --isa`` must name the level and go on."""
    import os
    import signal

    import torch

    from tests.helpers import tiny_cnn

    class DiesAtAvx(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tiny_cnn()

        def forward(self, x):
            if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX":
                os.kill(os.getpid(), signal.SIGSEGV)
            return self.inner(x)

    return DiesAtAvx().eval()
