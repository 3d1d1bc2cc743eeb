"""The fairseq-train options the package's commands set themselves
(fairseq_hybrid/command_lines/owned_options.py): each is an option fairseq-train knows
(a typo would silently set or drop nothing), and fairseq-hybrid-train
refuses every one it sets."""

import dataclasses

import pytest

from fairseq_hybrid.command_lines import owned_options
from fairseq_hybrid.commands.train import parse
from fairseq_hybrid.hybrid_group import HybridGroupConfig


def fairseq_train_options():
    from fairseq import options

    known = set(options.get_training_parser()._option_string_actions)
    return known | {"--" + field.name.replace("_", "-") for field in dataclasses.fields(HybridGroupConfig)}


def test_every_owned_option_is_one_fairseq_train_knows():
    known = fairseq_train_options()
    owned = set(owned_options.SET_BY_TRAIN + owned_options.SET_BY_PLAN + owned_options.SET_BY_MEASURE)
    assert sorted(owned - known) == []
    assert "--hybrid-softmax-chunks" in owned and "--hybrid-chunk-lenght" not in known  # the check has teeth


@pytest.mark.parametrize("option", owned_options.SET_BY_TRAIN)
def test_fairseq_hybrid_train_refuses_each_option_it_sets(option, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["--", "data", f"{option}=1"])
    assert exit_.value.code == 2
    assert f"{option} is set by fairseq-hybrid-train" in capsys.readouterr().err
