"""The LRA classifier (Momentum Transformer §4.3): mean pooling over real tokens (a padded batch
≡ each sequence alone), the dual encoder's [u, v, u·v, u − v], Table 1's constants, gradients,
errors."""
import pytest
import torch

from plugins.transformer import masked_mean
from recipes.lra.model import MODELS, ClassifierConfig, LRAClassifier, block_config

TINY = dict(vocab_size=12, max_length=40, n_classes=3, layers=2, d_model=8, heads=2, ffn_dim=16, mlp_dim=8,
            chunk_size=4)


def model_of(name, task="listops", **overrides):
    torch.manual_seed(0)
    model = LRAClassifier(name, task, ClassifierConfig(**{**TINY, **overrides})).double()
    with torch.no_grad():          # larger weights than the 0.02 embeddings, so that a leak shows
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model.eval()


def random_rows(lengths, vocab=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=generator) for n in lengths]


def check_padded_batch_against_each_alone(model, seed=0):
    rows = random_rows([13, 5, 9, 1], seed=seed)       # lengths no multiple of the chunk (4), one of 1 token
    padded = torch.zeros(len(rows), 13, dtype=torch.long)
    for i, row in enumerate(rows):
        padded[i, :len(row)] = row
    with torch.no_grad():
        batch = model(padded)
        alone = torch.cat([model(row[None]) for row in rows])
    torch.testing.assert_close(batch, alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", MODELS)
def test_a_padded_batch_gives_each_sequence_its_own_logits(name):
    check_padded_batch_against_each_alone(model_of(name))


def test_masked_mean_is_the_mean_of_the_real_positions():
    hidden = torch.randn(3, 5, 4, dtype=torch.float64)
    real = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)
    expected = torch.stack([hidden[0, :2].sum(0) / 2, hidden[1].sum(0) / 5,
                            (hidden[2, 1] + hidden[2, 3]) / 2])
    torch.testing.assert_close(masked_mean(hidden, real), expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(masked_mean(hidden, None), hidden.sum(1) / 5, rtol=0, atol=1e-15)


def test_pixel_tasks_have_no_padding_so_zero_is_a_pixel_value():
    model = model_of("momentum", "image", padding_id=None)
    tokens = torch.tensor([[0, 0, 5, 7], [5, 7, 0, 0]])
    with torch.no_grad():
        first, second = model(tokens)
        alone = model(tokens[:1, 2:])[0]
    assert not torch.allclose(first, alone)       # the zeros are pixels that count
    assert not torch.allclose(first, second)


@pytest.mark.parametrize("name", ["softmax", "adaptive"])
def test_the_dual_encoder_reads_u_v_their_product_and_difference(name):
    model = model_of(name, dual=True)
    rows = random_rows([7, 4, 6, 7], seed=1)
    pairs = torch.zeros(2, 2, 7, dtype=torch.long)
    for k, row in enumerate(rows):
        pairs[k // 2, k % 2, :len(row)] = row
    with torch.no_grad():
        logits = model(pairs)
        u = torch.cat([model.encoder(rows[0][None]), model.encoder(rows[2][None])])
        v = torch.cat([model.encoder(rows[1][None]), model.encoder(rows[3][None])])
        expected = model.head(torch.cat([u, v, u * v, u - v], dim=-1))
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)


def test_table_1_constants_per_task():
    config = ClassifierConfig(**TINY)
    listops = block_config("adaptive", "listops", config)
    assert (listops.momentum, listops.step_size, listops.connection, listops.connection_step_size) == \
        (0.1, 0.6, "adaptive", 0.4)
    text = block_config("momentum", "text", config)
    assert (text.momentum, text.step_size, text.connection) == (0.6, 2.0, "none")
    assert block_config("adaptive", "image", config).connection_step_size == 0.001
    pathfinder = block_config("momentum_connection", "pathfinder", config)
    assert (pathfinder.momentum, pathfinder.step_size, pathfinder.connection) == (0.3, 0.1, "momentum")
    linear = block_config("linear", "retrieval", config)
    assert (linear.attention, linear.feature_map, linear.causal) == ("linear", "elu", False)
    assert linear.momentum is None
    assert block_config("softmax", "text", config).attention == "softmax"


@pytest.mark.parametrize("name", MODELS)
def test_gradients_reach_every_parameter_but_not_the_padding_embedding(name):
    torch.manual_seed(0)
    model = LRAClassifier(name, "listops", ClassifierConfig(**TINY))
    tokens = torch.zeros(3, 10, dtype=torch.long)
    for i, row in enumerate(random_rows([10, 6, 3], seed=2)):
        tokens[i, :len(row)] = row
    loss = torch.nn.functional.cross_entropy(model(tokens), torch.tensor([0, 1, 2]))
    loss.backward()
    for parameter_name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), parameter_name
        if name == "softmax" and parameter_name.endswith("k_proj.bias"):
            continue      # q·(k + b) shifts every score of a row alike: softmax ignores it
        assert p.grad.abs().sum() > 0, parameter_name
    assert torch.equal(model.encoder.embed.weight.grad[0], torch.zeros(TINY["d_model"]))


def test_bad_inputs_are_refused_early():
    config = ClassifierConfig(**TINY)
    with pytest.raises(ValueError, match="name must be one of"):
        LRAClassifier("performer", "listops", config)
    with pytest.raises(ValueError, match="task must be one of"):
        LRAClassifier("linear", "cifar", config)
    with pytest.raises(ValueError, match="n_classes must be an integer >= 2"):
        ClassifierConfig(**{**TINY, "n_classes": 1})
    with pytest.raises(ValueError, match="padding_id must be None or an integer in"):
        ClassifierConfig(**{**TINY, "padding_id": 12})
    model = LRAClassifier("linear", "listops", config)
    with pytest.raises(TypeError, match="tokens must be int64 or int32"):
        model(torch.ones(1, 3))
    with pytest.raises(ValueError, match="at least one non-padding token"):
        model(torch.tensor([[1, 2], [0, 0]]))
    with pytest.raises(ValueError, match="more than max_length = 40"):
        model(torch.ones(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(batch, 2, length\)"):
        LRAClassifier("linear", "retrieval", ClassifierConfig(**{**TINY, "dual": True}))(
            torch.ones(2, 5, dtype=torch.long))


HYBRID = ("linear_attention", "full_attention")


@pytest.mark.parametrize("name", ["momentum", "adaptive", "linear"])
def test_a_hybrid_classifier_is_softmax_in_its_full_attention_layers(name):
    """--layer-types (issue 29): softmax in layer 1, the model's attention (Table 1's constants)
    in layer 0; a padded batch still gives each sequence its own logits."""
    model, plain = model_of(name, layer_types=HYBRID), model_of(name)
    configs = [block.config for block in model.encoder.blocks]
    assert configs[0] == plain.encoder.blocks[0].config
    assert configs[1].attention == "softmax" and configs[1].connection == configs[0].connection
    assert configs[1].feature_map == configs[0].feature_map and not configs[1].causal
    check_padded_batch_against_each_alone(model, seed=4)


def test_momentum_with_every_layer_full_attention_is_the_softmax_classifier():
    """Same seed, same weights, same configs: a wrong mapping or weight draw breaks this."""
    tokens = torch.tensor([[3, 5, 7, 0], [2, 4, 6, 8]])
    torch.manual_seed(0)
    everywhere = ClassifierConfig(**TINY, layer_types=["full_attention"] * 2)
    hybrid = LRAClassifier("momentum", "listops", everywhere)
    torch.manual_seed(0)
    softmax = LRAClassifier("softmax", "listops", ClassifierConfig(**TINY))
    assert hybrid.state_dict().keys() == softmax.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(hybrid.eval()(tokens), softmax.eval()(tokens), rtol=0, atol=0)


def test_layer_types_are_in_the_settings_and_refused_when_wrong():
    from recipes.lra.model import settings
    plain, hybrid = ClassifierConfig(**TINY), ClassifierConfig(**TINY, layer_types=list(HYBRID))
    assert settings("momentum", "text", hybrid)["layer_types"] == HYBRID
    assert "layer_types" not in settings("momentum", "text", plain)    # earlier runs keep their cache keys
    with pytest.raises(ValueError, match="layer_types has 3 entries but the model has 2 layers"):
        ClassifierConfig(**TINY, layer_types=["full_attention"] * 3)
    with pytest.raises(ValueError, match="each entry must be one of linear_attention, full_attention"):
        ClassifierConfig(**TINY, layer_types=["full_attention", "momentum"])
