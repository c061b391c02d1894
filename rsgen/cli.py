"""The `rsgen` command line. Thin: parse the recipe, then hand it to a stage's `run_*` function.

A bad recipe, model, output directory or missing input is one line on stderr from the main process and exit code
2 (`--debug` shows the traceback instead); messages go through `logging` at `--log_level`, and the other
processes of a multi-process run report warnings only.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import sys

from rsgen.config import (
    KEY_GROUPS,
    RecipeError,
    SourceConfig,
    default_text,
    load_recipe,
    parse_override_value,
    parse_overrides,
    recipe_keys_by_stage,
)
from rsgen.interrupt import RERUN_HINT, Interrupted, interruptible

EPILOG = """\
recipe overrides: any recipe key can follow as `--key value` (YAML value), e.g.
  rsgen run --config recipes/demo.yaml --output_dir runs/x --judge false --max_new_tokens 256

multi-process: accelerate launch --config_file accelerate_configs/multi_gpu.yaml -m rsgen run --config ...
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rsgen",
        description="Rejection-sampled training data for vision-language models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log_level", "--log-level", default="info", choices=LOG_LEVELS,
                        help="level of rsgen's messages (default: info; transformers and datasets: warning unless "
                             "this is higher; processes other than the main one: warning)")
    common.add_argument("--debug", action="store_true", help="show the full traceback of an error")

    def add_recipe_command(name: str, help_text: str, shown: tuple[str, ...] | None):
        sources = "sources" in shown if shown is not None else True
        p = sub.add_parser(name, help=help_text, usage=f"rsgen {name} --config RECIPE [--KEY VALUE ...]",
                           epilog=(_source_keys_help() + "\n" if sources else "") + EPILOG, parents=[common],
                           formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
        p.add_argument("--config", required=True, help="recipe YAML file (see recipes/)")
        _add_recipe_keys(p, shown)
        return p

    from rsgen.pipeline import STAGES

    add_recipe_command("run", f"all stages: {' -> '.join(stage.name for stage in STAGES)} (resumable)", None)
    for stage in STAGES:
        add_recipe_command(stage.name, stage.help, stage.keys)
    add_recipe_command("iterate", "rounds of the pipeline and TRL fine-tuning on what was accepted, measured on a "
                                  "held-out slice (resumable)", None)

    demo = sub.add_parser("demo", help="the whole pipeline on the embedded demo pool and the shipped demo model",
                          parents=[common])
    demo.add_argument("--output-dir", "--output_dir", dest="output_dir", default="runs/demo")
    demo.add_argument("--num-images", "--num_images", dest="num_images", type=int, default=None,
                      help="images in the freshly drawn demo pool (default: the demo recipe's)")
    demo.add_argument("--seed", type=int, default=None, help="pool seed (default: one the model never saw)")

    status = sub.add_parser("status", help="where a run stands (OUTPUT_DIR/progress.json as a table): finished, "
                                           "running, or stopped N minutes ago", parents=[common],
                            usage="rsgen status (--config RECIPE | --output_dir DIR)")
    where = status.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="the run's recipe (its output_dir is read)")
    where.add_argument("--output_dir", "--output-dir", dest="output_dir", help="the run's output directory")

    card = sub.add_parser("card", help="re-render OUTPUT_DIR/dataset/README.md from what is on disk", parents=[common])
    card.add_argument("output_dir")
    return parser


def _help(f: dataclasses.Field) -> str:
    return f"{f.metadata['help']} (default: {default_text(f)})".replace("%", "%%")


def _add_recipe_keys(parser: argparse.ArgumentParser, shown: tuple[str, ...] | None = None) -> None:
    """Every RecipeConfig key as `--key VALUE`, grouped by stage, help from the field metadata. Values stay text
    here and are read as YAML by the recipe loader, exactly as in the recipe file. `shown`: the keys the help
    lists (a stage's command: the keys that stage reads; None: all); the others are accepted all the same (a
    rerun of one stage passes the whole recipe), just not listed."""
    for stage, fields in recipe_keys_by_stage().items():
        listed = [f for f in fields if shown is None or f.name in shown]
        group = parser.add_argument_group(f"{stage} keys", KEY_GROUPS[stage]) if listed else parser
        for f in fields:
            help_text = _help(f) if f in listed else argparse.SUPPRESS
            group.add_argument(f"--{f.name}", metavar="VALUE", default=argparse.SUPPRESS, help=help_text)


def _source_keys_help() -> str:
    fields = dataclasses.fields(SourceConfig)
    width = max(len(f.name) for f in fields) + 2
    lines = ["source keys (each entry of `sources:`, in the recipe file or `--sources '[{...}]'`):"]
    lines += [f"  {f.name:<{width}}{f.metadata['help']} (default: {default_text(f)})" for f in fields]
    return "\n".join(lines) + "\n"


def _recipe_overrides(args: argparse.Namespace, rest: list[str]) -> dict:
    """`--key value` pairs argparse knows (the recipe keys) plus the rest (`--dashed-key`, typos: named by the
    recipe loader with the closest known keys)."""
    known = {f.name for fields in recipe_keys_by_stage().values() for f in fields}
    overrides = {k: parse_override_value(v) for k, v in vars(args).items() if k in known}
    return {**overrides, **parse_overrides(rest)}


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def is_main_process() -> bool:
    """Rank 0 of a launch (`accelerate launch` / torchrun set RANK), or a single process. Read from the
    environment: errors can come before the distributed state exists."""
    return int(os.environ.get("RANK", "0")) == 0


class _MessageFormatter(logging.Formatter):
    """`[logger] message`, with the level named only for warnings and errors (they must stand out in a long log)."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname}: " if record.levelno >= logging.WARNING else ""
        return f"[{record.name}] {level}{super().format(record)}"


def setup_logging(level: str, is_main: bool) -> None:
    """rsgen's messages at `level` on the main process, warnings only elsewhere. transformers and datasets log at
    warning (or `level` when higher); processes other than the main one draw no progress bars."""
    import datasets
    import huggingface_hub
    import transformers

    value = getattr(logging, level.upper()) if is_main else logging.WARNING
    handler = logging.StreamHandler()
    handler.setFormatter(_MessageFormatter())
    logging.basicConfig(handlers=[handler])  # a no-op where the root logger has handlers already
    logger = logging.getLogger("rsgen")
    logger.setLevel(value)
    libraries = max(value, logging.WARNING)
    transformers.utils.logging.set_verbosity(libraries)
    datasets.utils.logging.set_verbosity(libraries)
    if not is_main:
        transformers.utils.logging.disable_progress_bar()
        datasets.disable_progress_bars()
        huggingface_hub.utils.disable_progress_bars()


def main(argv: list[str] | None = None) -> None:
    parser = _build_parser()
    args, rest = parser.parse_known_args(argv)
    is_main = is_main_process()
    if args.command != "status":  # status reads one JSON file: no need to import transformers and datasets
        setup_logging(args.log_level, is_main)
    try:
        with interruptible():
            _run_command(parser, args, rest)
    except RecipeError as err:
        if args.debug:
            raise
        if is_main:
            print(f"rsgen: error: {_one_line(str(err))}", file=sys.stderr)
        raise SystemExit(2) from None
    except Interrupted as err:
        if is_main:
            print(f"rsgen: {RERUN_HINT}", file=sys.stderr)
        raise SystemExit(128 + err.signum) from None
    except OSError as err:
        if args.debug or err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # Every file is written under a temporary name and renamed when complete: a rerun trusts nothing half-written.
        where = f" writing {err.filename}" if err.filename else ""
        print(f"rsgen: error: no space left on device{where} ({_one_line(err.strerror or str(err))}); free some "
              "space, then rerun the same command to continue", file=sys.stderr)
        raise SystemExit(1) from None
    except RuntimeError as err:
        from rsgen.engine.base import EngineUnavailable  # here, not at the top: `rsgen --help` stays fast

        if args.debug or not isinstance(err, EngineUnavailable):
            raise
        # A server gone after its retries: finished records are on disk, the rerun continues.
        if is_main:
            print(f"rsgen: error: {_one_line(str(err))}", file=sys.stderr)
        raise SystemExit(1) from None


def _run_command(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> None:
    if args.command == "card":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from rsgen.emit import render_card

        path = render_card(args.output_dir)
        print(f"card written to {path}")
        return
    if args.command == "status":
        _print_status(parser, args, rest)
        return
    if args.command == "demo":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from rsgen.demo_command import run_demo

        run_demo(output_dir=args.output_dir, num_images=args.num_images, seed=args.seed)
        return

    recipe = load_recipe(args.config, _recipe_overrides(args, rest))
    if args.command == "run":
        from rsgen.pipeline import run_pipeline

        run_pipeline(recipe)
    elif args.command == "iterate":
        from rsgen.iterate import run_iterate
        from rsgen.iterate.report import print_rounds_table

        data = run_iterate(recipe)
        if is_main_process():
            print_rounds_table(data)
    else:
        from rsgen.pipeline import run_stage

        run_stage(args.command, recipe)


def _print_status(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> None:
    from rsgen.store.progress import read_progress, status_table

    output_dir = args.output_dir
    if args.config:  # the recipe's output_dir, with any `--output_dir`-style override after it
        output_dir = load_recipe(args.config, parse_overrides(rest)).output_dir
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        progress = read_progress(output_dir)
    except ValueError as err:  # a file half-copied from another cluster
        raise RecipeError(f"{output_dir}/progress.json is not readable JSON ({err})") from None
    if progress is None:
        raise RecipeError(f"no progress.json in {output_dir!r}: the run has not started there (or output_dir is "
                          "another one; check --config / --output_dir)")
    print(status_table(progress))


def _one_line(message: str) -> str:
    return " ".join(message.split())


if __name__ == "__main__":
    main()
