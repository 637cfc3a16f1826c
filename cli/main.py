"""The ``ptopt`` command: a thin click group whose subcommands are imported only when run.

``ptopt --help`` must answer in well under a second, so this module imports click alone; each
command lives in ``ptopt.cli.<name>`` and imports torch and the library inside its function.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
import warnings
from collections.abc import Iterator

import click

from ptopt.commands import COMMANDS

_default_show = warnings.showwarning


class LazyGroup(click.Group):
    """Lists every command of the command table (``ptopt.commands``) but imports a command's module
    only to run it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, c in COMMANDS.items() if c.cli and _module_exists(c.cli))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.list_commands(ctx):
            return None
        return _reported(importlib.import_module(COMMANDS[name].cli).command)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n].help) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


_QUIET_KEY = "ptopt.quiet"
#: ``--quiet`` for a command whose function takes none (export, prune, package, inspect, ...): noted in
#: ``ctx.meta``, read by ``_reported``
_QUIET = click.Option(
    ["--quiet", "-q"], is_flag=True, expose_value=False, help="No progress lines.",
    callback=lambda ctx, _param, value: ctx.meta.__setitem__(_QUIET_KEY, value),
)  # fmt: skip


def _reported(command: click.Command) -> click.Command:
    """The command with its long work reported on stderr (``ptopt.core.progress``: bars on a terminal,
    plain lines in a log), except under its ``--quiet`` / ``--no-progress``."""
    if getattr(command, "_ptopt_reported", False):
        return command
    if not {"quiet", "no_progress"} & {p.name for p in command.params}:
        command.params.append(_QUIET)
    invoke = command.invoke

    def reported(ctx: click.Context) -> object:
        # tqdm bars of a user's own from_pretrained / save_pretrained (a factory's): ptopt reports progress
        # itself, and the bars read 'Loading weights: 100%|####| 41/41' in a log; huggingface_hub reads this
        # when transformers is imported, which the CLI has not done yet
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from ptopt.core import progress
        from ptopt.core.errors import OptionIgnored
        from ptopt.core.options import named_by_flags, soft_options

        quiet = bool(ctx.params.get("quiet") or ctx.params.get("no_progress") or ctx.meta.get(_QUIET_KEY))
        env = _from_environment(ctx)
        started = _process_started()
        # the command itself is a step: whatever no inner step covers (imports, a call nothing times)
        # still gets its heartbeat
        with (
            progress.reporting(not quiet, since=started),
            progress.step(f"ptopt {command.name}", announce=False, since=started),
        ):
            with (
                named_by_flags(),
                soft_options(_origins(ctx, env)),
                _naming_the_environment(ctx, env),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("default", OptionIgnored)  # a note line, whatever the filters say
                return invoke(ctx)

    command.invoke = reported  # type: ignore[method-assign]
    command._ptopt_reported = True  # type: ignore[attr-defined]
    return command


def _from_environment(ctx: click.Context) -> set[str]:
    """The command's options whose value came from ``PTOPT_<COMMAND>_<OPTION>``: soft defaults
    (``ptopt.core.options.soft_options``), applied where they apply and left out where not, while
    the same option typed on the command line is refused where it does not apply."""
    from click.core import ParameterSource

    return {
        name
        for name, value in ctx.params.items()
        if value not in (None, ()) and ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT
    }


def _origins(ctx: click.Context, env: set[str]) -> dict[str, str]:
    """Where each option of ``env`` came from, as a note names it: ``PTOPT_VALIDATE_MAX_REGRESSION=5 in
    the environment``."""
    out = {}
    for name in env:
        var = f"{ctx.auto_envvar_prefix}_{name.upper()}"
        out[name] = f"{var}={os.environ.get(var, '')} in the environment"
    return out


@contextlib.contextmanager
def _naming_the_environment(ctx: click.Context, env: set[str]) -> Iterator[None]:
    """A refusal that names an option set in the environment says so (a user who typed nothing of the
    kind sees where it came from), e.g. ``--max-regression needs --baseline ... (--max-regression:
    PTOPT_VALIDATE_MAX_REGRESSION=5 in the environment)``."""
    from ptopt.core.errors import PtoptError

    try:
        yield
    except PtoptError as e:
        notes = []
        for param in ctx.command.params:
            flags = [f for f in param.opts if f.startswith("--")]
            if param.name in env and flags and any(f in str(e) for f in flags):
                var = f"{ctx.auto_envvar_prefix}_{param.name.upper()}"
                notes.append(f"{flags[0]}: {var}={os.environ.get(var, '')} in the environment")
        if notes and len(e.args) == 1:
            e.args = (f"{e.args[0]} ({'; '.join(notes)})",)
        raise


def _process_started() -> float:
    """When this process started, on ``time.monotonic()``'s clock (Linux: from ``/proc/self/stat``;
    elsewhere: now). A command's first heartbeat counts from it: the interpreter's start and the
    imports before the command runs (ptopt's package, click, the command's module: 1-2 s on a busy
    2-core machine) are part of the silence a CI log shows."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0 <= age < 60 else now


def _module_exists(module: str) -> bool:
    here = os.path.dirname(__file__)
    return os.path.exists(os.path.join(here, module.rsplit(".", 1)[1] + ".py"))


@click.group(
    cls=LazyGroup,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": 110,
        # every option can also be set as PTOPT_<COMMAND>_<OPTION> (e.g. PTOPT_VALIDATE_ROUNDS=30 on a
        # noisy CI runner); a flag given on the command line wins
        "auto_envvar_prefix": "PTOPT",
    },
)
@click.version_option(package_name="ptopt", prog_name="ptopt")
@click.option("--debug", is_flag=True, envvar="PTOPT_DEBUG", help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _group_help() -> str:
    """The group's help: every MODEL form from the format table (``core.formats.model_files``), the
    other references and the DATA forms."""
    import textwrap

    from ptopt.core.builtin_data import NAMES
    from ptopt.core.formats import model_files
    from ptopt.core.text import BUILTIN_TEXT

    models = (
        f"{model_files()}, hf:DIR (a Hugging Face model folder: a causal language model, or any other model "
        "as the class its config.json names), pkg.module:factory [--weights "
        "W.pt|W.safetensors], zoo:NAME; a .pt that pickles a whole nn.Module needs --allow-pickle"
    )
    data = (
        "data.pt / data.npz (x, optional y), "
        + ", ".join(f"builtin:{n}[:train|test]" for n in NAMES)
        + f", text (.txt: a language model's stream, builtin:{BUILTIN_TEXT}[:calib|eval]; one sample per line for"
        " a Hugging Face encoder or classifier folder), pkg.module:function"
    )

    def block(head: str, text: str) -> str:
        return textwrap.fill(
            text, 100, initial_indent=head.ljust(8), subsequent_indent=" " * 8, break_on_hyphens=False
        )

    return (
        "ptopt: compress, export, validate and package PyTorch models, with numbers for every artifact.\n\n"
        f"\b\n{block('MODEL:', models)}\n{block('DATA:', data)}\n"
        "Exit codes: 0 ok, 1 a gate failed, 2 bad usage or input, 4 (validate) a latency gate within the "
        "timing noise."
    )


cli.help = _group_help()


def _show_warning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings' hook
    """An option's old spelling (``ptopt.core.errors.OptionRenamed``) or an environment value left out
    (``OptionIgnored``) as one note; others as Python shows them."""
    from ptopt.compress.teacher_check import UntrainedTeacherWarning
    from ptopt.core.errors import OptionIgnored, OptionRenamed

    if issubclass(category, (OptionRenamed, OptionIgnored)):
        click.echo(f"note: {message}", err=True)
    elif issubclass(category, UntrainedTeacherWarning):  # from a pipeline's distill (ptopt run, optimize)
        click.echo(f"warning: {message}", err=True)
    else:
        _default_show(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the group and turns ``PtoptError`` into one line on stderr and its exit code."""
    warnings.showwarning = _show_warning
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _run(args, "--debug" in args or bool(os.environ.get("PTOPT_DEBUG")))
    finally:
        if argv is None:  # the ``ptopt`` process itself, not a caller's in-process main([...])
            _before_exit()


def _before_exit() -> None:
    """The process is about to exit: what the command wrote is flushed, its garbage collected now (their
    finalizers run), and the objects still alive frozen (``gc.freeze``: torch's, OpenVINO's, NNCF's and
    transformers' modules, millions of them), so that the interpreter's teardown skips them in its full
    collections. That walk was the silence after the last line: 15 s measured after an optimize run on
    a busy 2-core EPYC, 6-11 s for the same imports alone, 1-1.5 s with this. atexit handlers (temporary
    folders, compile-worker pools), the deallocation of what modules hold and the flush of stdout and
    stderr still run."""
    import gc

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    gc.collect()
    gc.freeze()


def _run(args: list[str], debug: bool) -> None:
    """Runs the group; ``PtoptError`` becomes one line on stderr and its exit code (``SystemExit``)."""
    try:
        cli.main(args=args, prog_name="ptopt", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the one place errors become exit codes
        from_ptopt = type(e).__module__.startswith("ptopt.") and hasattr(e, "exit_code")
        if debug:
            raise
        if from_ptopt:
            if not _echo_elsewhere():
                click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        click.echo(
            f"internal error: {type(e).__name__}: {e}\n(this is a bug in ptopt; rerun with --debug "
            "for the traceback and report it)",
            err=True,
        )
        sys.exit(3)
    sys.exit(0)


def _echo_elsewhere() -> bool:
    """Under torchrun every process meets the same bad input: rank 0 says it (``--nproc`` keeps the
    other ranks' lines in their logs, ``PTOPT_LAUNCHED``)."""
    rank = os.environ.get("RANK", "0")
    return (
        int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
        and rank != "0"
        and not os.environ.get("PTOPT_LAUNCHED")
    )


if __name__ == "__main__":  # pragma: no cover
    main()
