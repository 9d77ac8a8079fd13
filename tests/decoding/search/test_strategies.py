"""The strategy table against the searches themselves: every row has a search, each search
gives the hypotheses its row says and takes fusion tables only where its row says so (run,
not read back from the table); the streaming decoder refuses exactly the rows not marked to
stream (that each streaming row's stream equals its whole-utterance search:
test_streaming.py); `check` makes the refusals."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import FeatureConfig
from asrkit.decoding.fusion.boosting import no_boost
from asrkit.decoding.fusion.steps import as_tensors
from asrkit.decoding.fusion.tables import combine
from asrkit.decoding.search.front import _SEARCHES, DecodeOptions, search
from asrkit.decoding.search.strategies import STRATEGIES, check, strategy
from asrkit.decoding.streaming import StreamingDecoder
from asrkit.errors import InputError, UserError
from asrkit.models.transducer import Transducer
from tests.tiny import tiny_model_config

VOCAB = 9


def _network(decoder: str):
    config = tiny_model_config()
    if decoder == "tdt":
        config = dataclasses.replace(config, durations=(0, 1, 2))
    if decoder == "ctc":
        config = dataclasses.replace(config, ctc_head=True)
    network = Transducer(VOCAB, config)
    network.build_from_features(80)
    return network


def test_every_row_has_a_search():
    assert _SEARCHES.keys() == STRATEGIES.keys()


@pytest.mark.parametrize("key", sorted(STRATEGIES))
def test_each_search_gives_the_hypotheses_and_takes_the_fusion_its_row_says(key):
    decoder, method = key
    row = STRATEGIES[key]
    network = _network(decoder)
    assert strategy(method, network.config) is row
    encoded, lengths = network.encode(
        tf.random.stateless_normal([2, 40, 80], seed=[1, 2]), tf.constant([40, 31])
    )
    options = DecodeOptions(method, beam=3)
    found = search(network, encoded, lengths, options)
    assert found.tokens.shape[1] == row.hypotheses(3)
    tables = as_tensors(combine(no_boost(VOCAB)))
    if row.fusion:
        fused = search(network, encoded, lengths, options, tables)
        np.testing.assert_array_equal(fused.tokens.numpy(), found.tokens.numpy())
    else:
        with pytest.raises(InputError, match="works in greedy and beam search"):
            search(network, encoded, lengths, options, tables)


@pytest.mark.parametrize("key", [k for k in sorted(STRATEGIES) if k[0] != "ctc"])
def test_the_streaming_decoder_runs_the_rows_that_stream(key):
    decoder, method = key
    network = _network(decoder)
    beam = 3 if method == "beam" else 1
    if STRATEGIES[key].streams:
        StreamingDecoder(network, FeatureConfig(), beam=beam)
    else:
        with pytest.raises(UserError, match="streams with greedy search only"):
            StreamingDecoder(network, FeatureConfig(), beam=beam)


def test_check_makes_the_refusals():
    model = tiny_model_config()
    with pytest.raises(InputError, match="has no CTC head"):
        check("ctc", model)
    with pytest.raises(InputError, match="--boost and --lm work in greedy and beam search"):
        check("ctc", fusion=("--boost", "--lm"))
    with pytest.raises(InputError, match="--streaming exports greedy search: drop --method beam"):
        check("beam", model, streaming_export=True)
    with pytest.raises(InputError, match="--streaming decodes the transducer"):
        check("ctc", streaming=True)
    with pytest.raises(InputError, match="--nbest 5: greedy search finds one hypothesis"):
        check("greedy", model, nbest=5)
    assert check("beam", model, nbest=4, streaming=True).hypotheses(4) == 4
    assert check("greedy", dataclasses.replace(model, durations=(0, 1)),
                 streaming_export=True).decoder == "tdt"  # fmt: skip
