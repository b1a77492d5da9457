"""The command line's contract: help for every option, one meaning per flag across commands,
named flags that set config keys typed and checked by the schema itself."""
import argparse

import pytest

from dyntool import config
from dyntool.cli import CFG, build_parser, main, schema


def _commands(parser, path=()):
    """(path, subparser) for every command and subcommand."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield path + (name,), sp
                yield from _commands(sp, path + (name,))


def _options(sp):
    return [a for a in sp._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


COMMANDS = dict(_commands(build_parser()))


def test_every_option_of_every_command_has_help():
    assert {("sim", "toy"), ("sim", "sticky-markov"), ("train",), ("study",), ("figures",), ("ls",),
            ("info",), ("app",)} <= set(COMMANDS)
    missing = [f"{' '.join(path)} {a.option_strings or a.dest}" for path, sp in COMMANDS.items()
               for a in _options(sp) if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, missing


def test_sim_alone_prints_the_sim_help(capsys):
    assert main(["sim"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: dyntool sim ") and "sticky-markov" in out and "toy" in out


def _flags():
    """flag -> [(command, action)] over every command."""
    by_flag: dict[str, list] = {}
    for path, sp in COMMANDS.items():
        for a in _options(sp):
            for f in a.option_strings:
                by_flag.setdefault(f, []).append((" ".join(path), a))
    return by_flag


SAMPLES = ["3", "0", "1,2", "-1", "1e25", "0.5", "abc", ""]


def _parse(action, text):
    try:
        return ("ok", action.type(text) if action.type else text)
    except Exception as e:          # noqa: BLE001 - the kind of failure is what is compared
        return ("error", type(e).__name__)


def test_a_flag_means_the_same_in_every_command():
    """Same flag ⇒ same config leaf (or the same non-config meaning) and the same parse of any value."""
    shared = {f: uses for f, uses in _flags().items() if len(uses) > 1}
    assert "--seeds" in shared and "--max-steps" in shared and "--n-seeds" in shared
    for flag, uses in shared.items():
        leaves = {a.dest[len(CFG):].rsplit(".", 1)[-1] if a.dest.startswith(CFG) else a.dest for _, a in uses}
        assert len(leaves) == 1, (flag, [(c, a.dest) for c, a in uses])
        kinds = {(type(a).__name__, a.nargs) for _, a in uses}
        assert len(kinds) == 1, (flag, kinds)
        for text in SAMPLES:
            got = {c: _parse(a, text) for c, a in uses if a.type is not None or a.nargs is None}
            assert len(set(map(str, got.values()))) <= 1, (flag, text, got)


def test_seeds_is_a_list_and_n_seeds_a_count_everywhere():
    for cmd in ("sim sticky-markov", "study"):
        a = next(a for c, a in _flags()["--seeds"] if c == cmd)
        assert a.type("3") == [3] and a.type("4,5") == [4, 5]
    args = build_parser().parse_args(["study", "span", "--n-seeds", "3"])
    from dyntool.cli import config_values
    assert config_values(args) == {"seeds": [0, 1, 2]}
    args = build_parser().parse_args(["sim", "sticky-markov", "--n-seeds", "2"])
    assert config_values(args) == {"seeds": [0, 1]}


def test_a_flag_named_like_a_config_key_sets_that_key():
    """`--value-lr-mult` may not set `sweep`: a flag spelled like a key of the command's schema
    is that key (so --value-lr-mult=5 and --value_lr_mult=5 can never differ)."""
    checked = 0
    for path, sp in COMMANDS.items():
        ref = sp.get_default("schema")
        if ref is None:
            continue
        cls = schema(ref)
        leaves = {k.rsplit(".", 1)[-1]: k for k in config.keys(cls)}
        for a in _options(sp):
            for f in a.option_strings:
                name = f.lstrip("-").replace("-", "_")
                if a.dest.startswith(CFG):
                    key = a.dest[len(CFG):]
                    config.key_type(cls, key)                     # the declared key exists
                    section = config.key_type(cls, key.rsplit(".", 1)[0]) if "." in key else cls
                    old = config.renamed(section).get(name)                # an old name of the key
                    assert key.rsplit(".", 1)[-1] in (name, old), (path, f, key)
                    checked += 1
                else:
                    assert name not in leaves, (path, f, "shadows config key", leaves.get(name))
    assert checked >= 10


def test_named_flags_reach_the_config_typed(monkeypatch):
    seen = {}

    def fake_load(cls, path=None, preset=None, overrides=None, values=None, base=None):
        seen.update(values=values, overrides=overrides)
        raise SystemExit(0)
    monkeypatch.setattr(config, "load", fake_load)
    main(["sim", "sticky-markov", "--seeds", "4,5", "--T", "60", "--sweep", "1,2", "--lr=0.1"])
    assert seen["values"] == {"seeds": [4, 5], "T": 60, "sweep": [1.0, 2.0]}
    assert type(seen["values"]["T"]) is int and seen["overrides"] == ["--lr=0.1"]


@pytest.mark.parametrize("argv", [["sim", "toy", "--help"], ["sim", "sticky-markov", "--help"],
                                  ["train", "--help"], ["study", "--help"], ["figures", "--help"]])
def test_help_exits_0(argv, capsys):
    assert main(argv) == 0
    assert "--out" in capsys.readouterr().out


def test_old_window_flag_sets_crop_and_says_so(monkeypatch):
    """--window (the recorded crop's old flag) still works, with one deprecation warning; given
    beside --crop it is refused rather than silently ignored."""
    seen = {}

    def fake_load(cls, path=None, preset=None, overrides=None, values=None, base=None):
        seen.update(values=values)
        raise SystemExit(0)
    monkeypatch.setattr(config, "load", fake_load)
    with pytest.warns(config.DeprecatedKeyWarning, match="--window is deprecated, use --crop"):
        main(["sim", "sticky-markov", "--window", "30"])
    assert seen["values"] == {"crop": 30}
    assert main(["sim", "sticky-markov", "--window", "30", "--crop", "20"]) == 2
