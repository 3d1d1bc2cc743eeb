"""The hybrid_lstm architecture: registration, presets, shapes, the RNN /
attention-softmax split, and incremental decoding."""

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from conftest import build_model, make_sample
from fairseq_hybrid.models.hybrid_lstm import HybridLSTMModel, RNNOutput


def test_presets_are_registered_with_their_sizes():
    for name in ("hybrid_lstm", "hybrid_lstm_tiny", "hybrid_lstm_base", "hybrid_lstm_paper"):
        assert ARCH_MODEL_REGISTRY[name] is HybridLSTMModel
    paper = build_model("hybrid_lstm_paper")
    assert len(paper.encoder.stack.layers) == 4 and len(paper.decoder.stack.layers) == 4
    assert all(layer.hidden_size == 1024 for layer in paper.decoder.stack.layers)
    base = build_model("hybrid_lstm_base")
    assert [layer.bidirectional for layer in base.encoder.stack.layers] == [True, False]
    assert base.decoder.stack.layers[0].hidden_size == 256


def test_user_options_override_the_preset():
    model = build_model("hybrid_lstm_tiny", encoder_layers=3, encoder_bidirectional_layers=2, decoder_hidden_size=48)
    assert [layer.bidirectional for layer in model.encoder.stack.layers] == [True, True, False]
    assert model.decoder.stack.layers[0].hidden_size == 48


def test_bad_configuration_is_refused_clearly():
    with pytest.raises(ValueError, match="encoder-bidirectional-layers"):
        build_model("hybrid_lstm_tiny", encoder_bidirectional_layers=3)
    with pytest.raises(ValueError, match="dot attention"):
        build_model("hybrid_lstm_tiny", attention_type="dot", encoder_bidirectional_layers=2)
    with pytest.raises(ValueError, match="decoder-out-embed-dim"):
        build_model("hybrid_lstm_tiny", share_decoder_input_output_embed=True, decoder_out_embed_dim=16)


@pytest.mark.parametrize("attention_type", ["dot", "general", "mlp"])
def test_shapes(dictionaries, attention_type):
    src_dict, tgt_dict = dictionaries
    overrides = {"attention_type": attention_type}
    if attention_type == "dot":
        overrides["encoder_bidirectional_layers"] = 1  # top layer unidirectional: 32 == 32
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **overrides)
    sample = make_sample(src_dict, tgt_dict, [5, 3, 7], [4, 6, 2])
    logits, extra = model(**sample["net_input"])
    batch, tgt_len = sample["target"].shape
    src_len = sample["net_input"]["src_tokens"].size(1)
    assert logits.shape == (batch, tgt_len, len(tgt_dict))
    assert extra["attn"][0].shape == (batch, tgt_len, src_len)
    rnn_out = model.forward_rnn(**sample["net_input"])
    assert isinstance(rnn_out, RNNOutput)
    assert rnn_out.decoder_states.shape == (batch, tgt_len, 32)
    assert rnn_out.encoder_states.shape == (batch, src_len, 32)


def test_attention_never_looks_at_padding(dictionaries):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict).eval()
    sample = make_sample(src_dict, tgt_dict, [2, 8], [3, 3])
    _, extra = model(**sample["net_input"])
    attn = extra["attn"][0]
    lengths = sample["net_input"]["src_lengths"]
    assert sorted(lengths.tolist()) == [3, 9]
    # The 2-token sentence (3 with eos) is padded; its weights beyond 3 are zero.
    short = lengths.argmin()
    assert attn[short, :, : lengths[short]].gt(0).all()
    assert torch.all(attn[short, :, lengths[short]:] == 0)
    assert torch.allclose(attn.sum(-1), torch.ones(2, attn.size(1)))


def test_padding_does_not_change_a_sentence(dictionaries):
    """A sentence's outputs are the same alone and in a padded batch."""
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, encoder_bidirectional_layers=2).eval()
    batch = make_sample(src_dict, tgt_dict, [3, 9], [5, 2], seed=3)
    short = batch["net_input"]["src_lengths"].argmin().item()
    alone_src = batch["net_input"]["src_tokens"][short : short + 1]
    alone_src = alone_src[:, alone_src.ne(src_dict.pad())[0]]
    tgt_len = batch["target"][short].ne(tgt_dict.pad()).sum()
    alone = model(alone_src, batch["net_input"]["src_lengths"][short : short + 1],
                  batch["net_input"]["prev_output_tokens"][short : short + 1, :tgt_len])[0]
    together = model(**batch["net_input"])[0][short : short + 1, :tgt_len]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"residual": True, "encoder_layers": 3, "decoder_layers": 3},
                                       {"decoder_layers": 3}, {"share_decoder_input_output_embed": True},
                                       {"hybrid_devices": "cpu,cpu"},
                                       {"hybrid_devices": "3", "encoder_layers": 3, "decoder_layers": 3}])
def test_incremental_decoding_equals_full_forward(dictionaries, overrides):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **overrides).eval()
    sample = make_sample(src_dict, tgt_dict, [6, 4, 5], [7, 7, 7], seed=1)
    net_input = sample["net_input"]
    full_logits, full_extra = model(**net_input)
    full_lprobs = model.get_normalized_probs((full_logits, None), log_probs=True)

    encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
    # Beam search reorders the batch between steps: do the same with a
    # permutation and undo it, to exercise reorder_incremental_state.
    order = torch.tensor([2, 0, 1])
    encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
    tokens = net_input["prev_output_tokens"][order]
    incremental_state = {}
    steps = []
    for t in range(tokens.size(1)):
        logits, extra = model.decoder(tokens[:, : t + 1], encoder_out, incremental_state)
        steps.append(model.get_normalized_probs((logits, None), log_probs=True))
        if t == 2:
            identity = torch.arange(3)
            model.decoder.reorder_incremental_state_scripting(incremental_state, identity)
    step_lprobs = torch.cat(steps, dim=1)
    inverse = torch.argsort(order)
    torch.testing.assert_close(step_lprobs[inverse], full_lprobs, rtol=1e-5, atol=1e-5)


def test_tied_embeddings_share_one_tensor(dictionaries):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, share_decoder_input_output_embed=True)
    assert model.decoder.attention_softmax.output_weight is model.decoder.stack.embed_tokens.weight
