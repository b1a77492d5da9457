"""Near misses get named: a flag one letter off (``--max-step``) and a hub id one letter off
(``hf:Salesforce/wikitxt``), each in one line with exit 2, nothing downloaded or created."""
from __future__ import annotations

import pytest

from dyntool.cli import main


@pytest.mark.parametrize("argv, wrong, right", [
    (["train", "--config", "wikitext_mhsa", "--max-step", "20"], "--max-step", "--max-steps"),
    (["train", "--config", "wikitext_mhsa", "--max-step=20"], "--max-step", "--max-steps"),
    (["study", "span", "--max-step", "3"], "--max-step", "--max-steps"),
    (["sim", "toy", "--step", "3"], "--step", "--steps"),
])
def test_a_flag_typo_names_the_flag(argv, wrong, right, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"unrecognized argument {wrong}; did you mean {right}?" in err[0]
    assert not (tmp_path / "o").exists()


def test_top_level_config_keys_stay_overrides(tmp_path, capsys):
    # --seed is a config key (not a typo of --seeds); --max-steps 0 then fails on its own bound
    assert main(["train", "--config", "wikitext_mhsa", "--seed=3", "--max-steps", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "max_steps" in err


@pytest.mark.parametrize("spec, meant", [("hf:Salesforce/wikitxt", "hf:Salesforce/wikitext"),
                                         ("hf:salesforce/wikitext/wikitext-103-v1",
                                          "hf:Salesforce/wikitext/wikitext-103-v1")])
def test_a_hub_id_typo_is_named_without_a_download(spec, meant, monkeypatch):
    import huggingface_hub

    from dyntool.data.sources import DataError, resolve
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda *a, **k: pytest.fail("must not reach the hub"))
    with pytest.raises(DataError, match="looks like a typo") as e:
        resolve(spec)
    assert f"did you mean {meant}?" in str(e.value) and "nothing was downloaded" in str(e.value)


def test_another_hub_dataset_is_not_called_a_typo():
    from dyntool.data.sources import parse_hub
    assert parse_hub("hf:someone/other-corpus") == ("someone/other-corpus", "wikitext-2-v1")
