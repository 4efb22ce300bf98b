"""Megatron-LM's `--data-path` words become datasets, read as megatron-core reads them.

`tests/fixtures/megatron/blends.json` holds what megatron-core 0.16.1's own
`get_blend_from_list` and its builder's `normalize` made of each word list
(`make_fixture.py`); no one here wrote those answers.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xlstm_data as xd
from tests.helpers import MEGATRON_FIXTURES, MEGATRON_WEB
from tests.multiprocess import REPO
from xlstm_data.cli.inspect_config import inspect_config, load_config
from xlstm_data.cli.main import main as cli_main
from xlstm_data.config.data_config import validate_data_config
from xlstm_data.config.megatron_blend import UNWEIGHTED_NAME
from xlstm_data.errors import DataConfigError
from xlstm_data.plan.mixture import parse_mixture_schedule

BLENDS = json.loads((MEGATRON_FIXTURES / "blends.json").read_text())
MEGATRON_CONFIG = REPO / "configs" / "megatron.py"
#: A config of one dataset per name given after its colon (comma-separated).
NAMES_CONFIG = Path(__file__).with_name("fixtures") / "names_config.py"


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("words", sorted(BLENDS))
def test_each_blend_is_the_one_megatron_core_reads_or_is_refused_naming_the_word(words):
    theirs = BLENDS[words]
    if any(map(_is_number, theirs["prefixes"])):  # Megatron looks for a corpus named "0.3"
        with pytest.raises(
            DataConfigError, match=r"data_path=.*: (the last weight|word \d+ .*should be)"
        ):
            xd.megatron_datasets(words)
        return
    ours = xd.megatron_datasets(words)
    if theirs["weights"] is None:  # by each corpus's size: one source over all of them
        (dataset,) = ours.values()
        paths = dataset["path"] if isinstance(dataset["path"], list) else [dataset["path"]]
        assert paths == theirs["prefixes"] and "weight" not in dataset
        return
    assert [d["path"] for d in ours.values()] == theirs["prefixes"]
    assert [d["weight"] for d in ours.values()] == pytest.approx(theirs["weights"])
    names = list(ours)
    stage = parse_mixture_schedule(None, names, {n: d["weight"] for n, d in ours.items()})
    assert list(stage.weights[0]) == pytest.approx(theirs["blended"])  # normalised alike


#: Prefixes whose file names start with digits, are keywords or ConfigDict methods too.
_PREFIX = st.from_regex(
    r"(/[a-z0-9._-]{1,8}){0,2}/([a-z0-9._-]{1,8}|class|items|None|keys)", fullmatch=True
).filter(lambda p: not _is_number(p.rsplit("/", 1)[-1]))
_WEIGHT = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(st.tuples(_WEIGHT, _PREFIX), min_size=1, max_size=6).filter(
        lambda pairs: any(w > 0 for w, _ in pairs)
    ),
    as_list=st.booleans(),
)
def test_weighted_words_give_one_dataset_per_prefix_in_order_named_as_config_keys(pairs, as_list):
    words = [str(x) for pair in pairs for x in pair]
    datasets = xd.megatron_datasets(words if as_list else " ".join(words), end_of_document=7)
    assert [(d["weight"], d["path"]) for d in datasets.values()] == [
        (float(repr(w)), p) for w, p in pairs
    ]
    assert all(d["kind"] == "megatron" and d["end_of_document"] == 7 for d in datasets.values())
    for name, (_, prefix) in zip(datasets, pairs, strict=True):
        assert re.sub(r"\W", "_", prefix.rsplit("/", 1)[-1]) in name
    _assert_overrides_name_each(datasets)
    evaluated = xd.megatron_datasets(words, mixed=False)  # data.eval: not mixed, no weights
    assert list(evaluated) == list(datasets)
    assert not any("weight" in d for d in evaluated.values())


def _assert_overrides_name_each(datasets: dict) -> None:
    """`--config.data.train.NAME.vocab_size=5` reaches each dataset, through config_flags."""
    from absl import flags

    from xlstm_data.config.overrides import define_config_file

    names = list(datasets)
    argv = ["prog", f"--config={NAMES_CONFIG}:{','.join(names)}"]
    argv += [f"--config.data.train.{name}.vocab_size=5" for name in names]
    values = flags.FlagValues()
    define_config_file("config", flag_values=values, sys_argv=argv)
    values(argv)
    assert [values.config.data.train[name].vocab_size for name in names] == [5] * len(names)


@settings(max_examples=30, deadline=None)
@given(prefixes=st.lists(_PREFIX, min_size=1, max_size=5))
def test_prefixes_alone_are_one_dataset_over_all_of_them(prefixes):
    (name, dataset), *_ = xd.megatron_datasets(" ".join(prefixes), split="98,2").items()
    assert name == UNWEIGHTED_NAME and len(xd.megatron_datasets(prefixes)) == 1
    assert dataset["path"] == (prefixes[0] if len(prefixes) == 1 else prefixes)
    assert dataset["split"] == "98,2"


@pytest.mark.parametrize(
    ("data_path", "match"),
    [
        ("", r"data_path='' names no corpus"),
        (["a", ""], r"names no corpus"),
        (3, r"data_path=3 is not Megatron's --data-path"),
        ([True, "a"], r"is not Megatron's --data-path"),
        (
            "0.7 /data/web 0.3",
            r"='0\.7 /data/web 0\.3': the last weight \('0\.3'\) has no corpus prefix after it",
        ),
        ("0.7 /data/web /data/code", r"word 3 \('/data/code'\) should be a weight"),
        ("/data/web 0.7", r"word 1 \('/data/web'\) should be a weight"),
        ("0.7 0.3 /data/web", r"word 2 \('0\.3'\) should be a corpus prefix"),
        ("-1 /data/web 2 /data/code", r"the weight of '/data/web' is '-1'; expected a finite"),
        ("1e400 /data/web", r"the weight of '/data/web' is '1e400'"),
        ("0 /data/web 0 /data/code", r"='0 /data/web 0 /data/code': every weight is zero"),
    ],
)
def test_words_that_are_not_a_blend_are_one_error_naming_the_word(data_path, match):
    with pytest.raises(DataConfigError, match=match):
        xd.megatron_datasets(data_path)


@pytest.mark.parametrize("key", ["kind", "path", "weight"])
def test_options_cannot_set_what_the_words_give(key):
    with pytest.raises(DataConfigError, match=f"data_path: {key}=.* is given by the --data-path"):
        xd.megatron_datasets("0.5 /a 0.5 /b", **{key: "/x"})


def test_a_blend_in_the_shipped_config_serves_its_weights(tmp_path):
    """`configs/megatron.py:'0.7 A 0.3 B,EOD'` as `inspect` shows it: 70/30 of the tokens."""
    config = load_config(f"{MEGATRON_CONFIG}:0.7 {MEGATRON_WEB} 0.3 {MEGATRON_WEB},50256")
    config.data.global_batch_size = 16
    config.data.max_target_length = 32
    train = validate_data_config(config.data).train
    assert [(s.name, s.weight) for s in train] == [
        ("web_text_document", 0.7),
        ("web_text_document_2", 0.3),
    ]
    plan = inspect_config(config, png=str(tmp_path / "p.png"), plot_steps=200, out=io.StringIO())
    assert plan["measured_shares"] == pytest.approx(
        {"web_text_document": 0.7, "web_text_document_2": 0.3}, abs=0.03
    )


def test_a_bad_blend_after_the_configs_colon_is_one_error_line(capsys):
    argument = f"0.7 {MEGATRON_WEB} 0.3,50256"
    assert cli_main(["inspect", f"--config={MEGATRON_CONFIG}:{argument}"]) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    (line,) = [line for line in error.splitlines() if "error:" in line]
    assert f"data_path='0.7 {MEGATRON_WEB} 0.3': the last weight ('0.3') has no corpus" in line
    assert line.count("0.7") == 2  # the flag as given, then the words once


def test_a_blend_and_its_valid_part_make_the_train_and_eval_sets_of_one_config():
    """As the config's docstring says: the same words, split, and the valid part for eval."""
    words = f"0.7 {MEGATRON_WEB} 0.3 {MEGATRON_WEB}"
    options = {"end_of_document": 50256, "split": "969,30,1"}
    data = {
        "train": xd.megatron_datasets(words, **options),
        "eval": xd.megatron_datasets(words, mixed=False, split_part="valid", **options),
        "global_batch_size": 4,
        "max_target_length": 32,
    }
    train, evals = xd.iterators_from_config(data, xd.create_mesh())
    try:
        assert sorted(evals) == ["web_text_document_2_valid", "web_text_document_valid"]
        assert next(train).inputs.shape == (4, 32)
        assert next(evals["web_text_document_valid"]).inputs.shape[1] == 32
    finally:
        for iterator in (train, *evals.values()):
            iterator.close()


def test_a_prefix_given_with_its_bin_or_idx_suffix_is_named_as_the_prefix():
    datasets = xd.megatron_datasets("0.5 /d/web_text_document.bin 0.5 /e/web_text_document.idx")
    assert list(datasets) == ["web_text_document", "web_text_document_2"]


def test_an_override_of_a_dataset_the_blend_does_not_have_lists_the_ones_it_has(capsys):
    """The docs' `...corpus.split` names the dataset of one prefix; a blend's are named apart."""
    config = f"--config={MEGATRON_CONFIG}:0.7 {MEGATRON_WEB} 0.3 {MEGATRON_WEB},50256"
    assert cli_main(["inspect", config, "--config.data.train.corpus.split=969,30,1"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "no section 'corpus'; data.train has sections: web_text_document, " in line
