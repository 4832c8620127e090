"""Both commands keep the conventions a new user expects: `--version`, a description that is not
cut mid-sentence, and help for every option that says its default."""

from __future__ import annotations

import argparse

import pytest

import dohnuts
from dohnuts.bench.cli import build_parser as bench_parser
from dohnuts.cli import build_parser as dohnuts_parser


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for inner, subsub in _subparsers(sub):
                    yield f"{name} {inner}", subsub


@pytest.mark.parametrize("build, prog", [(dohnuts_parser, "dohnuts"), (bench_parser, "dohnuts-bench")])
def test_version(build, prog, capsys):
    with pytest.raises(SystemExit) as done:
        build().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {dohnuts.__version__}"


@pytest.mark.parametrize("build", [dohnuts_parser, bench_parser], ids=["dohnuts", "dohnuts-bench"])
def test_every_option_has_help_that_says_its_default(build):
    missing = []
    for name, sub in _subparsers(build()):
        for action in sub._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue  # positionals are required: no default to state
            text = action.help or ""
            if "default" not in text:
                missing.append(f"{name} {'/'.join(action.option_strings)}: {text!r}")
    assert not missing, "\n".join(missing)


def test_dohnuts_train_help_shows_every_flag_with_its_default(capsys):
    with pytest.raises(SystemExit):
        dohnuts_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split()).split("options:", 1)[1]
    for flag, default in (("--model", "tiny"), ("--updates", "200"), ("--eval-every", "25"), ("--lr", "2e-3"),
                          ("--max-grad-norm", "1.0"), ("--lora-rank", "8"), ("--lora-alpha", "16.0"),
                          ("--seed", "0"), ("--device", "cuda when available")):
        metavar = flag.lstrip("-").upper().replace("-", "_")
        entry = text.split(f"{flag} {metavar} ", 1)[1].split(" --", 1)[0]  # the flag's own help
        assert f"(default: {default})" in entry, flag


def test_the_bench_description_is_whole(capsys):
    with pytest.raises(SystemExit):
        bench_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "measure complete calls of the scoring model and say how far each stage is from what the hardware " \
           "allows." in text


def test_the_bench_lists_the_commands_it_always_had(capsys):
    """`dohnuts-bench --help` lists the subcommands it listed before they moved into
    dohnuts/bench/commands/ (one module a command), in the same order."""
    with pytest.raises(SystemExit):
        bench_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    listed = text.split("{", 1)[1].split("}", 1)[0].split(",")
    assert listed == ["run", "analyze", "compare", "list", "history", "store", "baseline", "gate", "report",
                      "calibrate", "export", "schema"]
    store = dict(_subparsers(bench_parser()))["store"]
    assert {name for name, _ in _subparsers(store)} == {"import", "archive"}
