"""The command line: a thin click layer over the modules that do the work."""

import difflib
import importlib
import json
import sys
from typing import NoReturn

import click

from rdna1_kmgr import __version__
from rdna1_kmgr.core import command_log, output, program_path, root_only
from rdna1_kmgr.core.errors import Exit, HostError, KmgrError, UsageError

# Each command's module is imported when that command runs (or `--help` lists them all): the boot guard's
# services run `boot-check` and `confirm` at every boot, and importing every command first cost each of them
# 0.2 s here and 2-3 s of a guest's boot under QEMU's emulated CPU (boot-check 3.3 s, now 1.5 s).
COMMANDS = {
    "detect": "detect:detect",
    "doctor": "doctor:doctor",
    "experiment": "experiment:experiment",
    "render": "render:render",
    "quirks": "render:quirks",
    "build": "build:build",
    "keys": "keys:keys",
    "vm-test": "vmtest:vmtest",
    "install": "install:install",
    "confirm": "boot_guard:confirm",
    "retry": "boot_guard:retry",
    "boot-check": "boot_guard:boot_check",
    "rollback": "rollback:rollback",
    "status": "status:status",
    "profile": "profile:profile",
    "follow": "follow:follow",
    "hooks": "hooks:hooks",
    "report": "report:report",
}


class KmgrGroup(click.Group):
    """Finds the commands in COMMANDS; turns a KmgrError anywhere below into one line on stderr and its exit
    code, and so a permission refused (a user reading root's state)."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attribute = COMMANDS[name].split(":")
        return getattr(importlib.import_module(f"rdna1_kmgr.commands.{module}"), attribute)

    def parse_args(self, ctx, args):
        ctx.meta[root_only.ARGV_KEY] = list(args)  # the command line as typed, for a hint that repeats it
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        # shell completion parses resiliently: click's own answer there, never an error line
        if name and not name.startswith("-") and name not in COMMANDS and not ctx.resilient_parsing:
            close = difflib.get_close_matches(name, COMMANDS, n=1)
            raise UsageError(
                f"no command {name!r}",
                (f"did you mean `{close[0]}`? " if close else "") + "`rdna1-kmgr --help` lists the commands",
            )
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        program_path.include_system_programs()
        command_log.start()
        try:
            result = super().invoke(ctx)
            if isinstance(result, output.Shown):
                _show(ctx, result)
            return result
        except PermissionError as err:
            # Mostly root's own state, journal and logs (0700, root's alone) read by a command run as a user.
            denied = HostError(
                f"{err.strerror.lower() if err.strerror else 'permission denied'}: {err.filename}",
                "rdna1-kmgr keeps its state and logs root's alone: "
                f"run `sudo rdna1-kmgr {root_only.typed(ctx.invoked_subcommand or '')}`",
            )
            _fail(ctx, denied)
        except KmgrError as err:
            _fail(ctx, err)
        except click.UsageError as err:  # click's own (an unknown option): its usage text on stderr as ever
            if _wants_json(ctx):
                what = err.format_message()
                click.echo(json.dumps(output.error_json(what, None, int(Exit.USAGE), "usage", _command(ctx, err))))
            raise


def _show(ctx: click.Context, result: output.Shown) -> None:
    """A command's result shown, then the command ended as the result says (a failing verdict: its error)."""
    output.show(ctx, result)
    if result.failure is not None:
        raise result.failure
    if result.exit_code:
        sys.exit(result.exit_code)


def _command(ctx: click.Context, err: click.UsageError) -> str:
    """The words of the command click refused (its own context's: a group's --json may have named the group)."""
    if err.ctx is not None:
        return " ".join(err.ctx.command_path.split()[1:])
    return output.command_words(ctx)


def _wants_json(ctx: click.Context) -> bool:
    """--json was given and nothing answered it yet (a failing verdict's record is its answer)."""
    given = ctx.meta.get(output.WANTS_JSON) or "--json" in ctx.meta.get(root_only.ARGV_KEY, ())
    return bool(given) and not ctx.meta.get(output.PRINTED_RESULT)


def _fail(ctx: click.Context, err: KmgrError) -> NoReturn:
    """The error's one line on stderr, its exit code; with --json, the same as a JSON object on stdout too (a
    script reading the output gets an answer it can parse, whatever went wrong)."""
    click.echo(f"rdna1-kmgr: error: {err.line()}", err=True)
    if _wants_json(ctx):
        kind = err.exit_code.name.lower()
        words = output.command_words(ctx) or (ctx.invoked_subcommand or "")
        click.echo(json.dumps(output.error_json(err.what, err.hint, int(err.exit_code), kind, words)))
    sys.exit(err.exit_code)


@click.group(cls=KmgrGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rdna1-kmgr")
def main():
    """Patch, build, validate and install amdgpu for first-generation RDNA GPUs (RX 5600 XT and siblings)."""
