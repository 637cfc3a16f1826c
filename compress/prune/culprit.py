"""Which module to keep whole when a pruned model's own ``forward`` fails: the one whose code made the tensor
the failing layer received.

A layer fails on the sizes it is given; the module that gave them is the one whose code cannot follow the
new channel counts. The innermost of the model's own modules in the traceback is often a wrapper that only
handed its input on (timm's ``ConvNormAct`` around a ``Conv2d``): keeping every ``ConvNormAct`` whole
keeps every convolution of the network and names the wrong cause. The tensor was made further out (timm's
``CrossStage`` splits its expanded channels at ``self.expand_chs // 2``, a size fixed in its code). So
the forward is run once more with hooks that record the tensors each module call received, and the
failing layer's input is followed outwards, through the calls in the error's traceback, past those that
passed it on unchanged.
"""

from __future__ import annotations

from typing import Any


def maker(model: Any, example_inputs: Any, ours: set[int]) -> tuple[Any, str] | None:
    """(the module of ``ours`` whose own code made the input of the layer the forward fails in, that
    layer's qualified name), or None: the forward runs this time, fails in one of ours, or the input was
    made by a torch container or the model's own code."""
    chain = _failing_chain(model, example_inputs)
    if len(chain) < 2 or id(chain[-1][0]) in ours:
        return None
    names = {id(m): n for n, m in model.named_modules()}
    received = chain[-1][1]
    if not received:
        return None
    for module, given in reversed(chain[:-1]):
        if received <= given:
            continue  # handed on unchanged
        if id(module) in ours:
            return module, names.get(id(chain[-1][0]), type(chain[-1][0]).__name__)
        return None
    return None


def _failing_chain(model: Any, example_inputs: Any) -> list[tuple[Any, frozenset[int]]]:
    """The module calls active when ``model``'s forward raises (outermost first: the modules in the error's
    traceback), each with the ids of the tensors it was given (recorded by a hook on each call); ``[]``
    when it runs."""
    import torch

    from ptopt.core.inputspec import call_model

    given: dict[int, frozenset[int]] = {}

    def enter(module: Any, args: Any, kwargs: Any) -> None:
        given[id(module)] = _tensor_ids((args, kwargs))

    handles = [m.register_forward_pre_hook(enter, with_kwargs=True) for m in model.modules()]
    try:
        with torch.no_grad():
            call_model(model, example_inputs)
        return []
    except Exception as e:  # noqa: BLE001 - the failure being explained
        return [(m, given.get(id(m), frozenset())) for m in active_modules(e)]
    finally:
        for handle in handles:
            handle.remove()


def active_modules(error: BaseException) -> list[Any]:
    """The modules whose call the error (or the error it was raised from) passed through, outermost first."""
    import torch

    found: list[Any] = []
    while error is not None and not found:
        tb = error.__traceback__
        while tb is not None:
            this = tb.tb_frame.f_locals.get("self")
            if isinstance(this, torch.nn.Module) and not (found and found[-1] is this):
                found.append(this)
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return found


def _tensor_ids(value: Any) -> frozenset[int]:
    """Ids of the tensors in ``value`` (tuples, lists and dicts followed)."""
    import torch

    found: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            found.add(id(item))
        elif isinstance(item, (tuple, list)):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
    return frozenset(found)
