"""The discretized mixture of logistics (PixelCNN++ (Salimans et al. 2017), eq. 2-3) of
recipes/image_generation: the log-likelihood against a direct float64 evaluation written here
from the paper's formula (bin CDF differences, edge bins to ±∞), mpmath where the bin masses
underflow, normalisation over all 256 (or 256³) levels, the sampler's histograms against the
distribution, bits/dim of known distributions, finite gradients at the edges, and errors."""
import math

import mpmath
import numpy as np
import pytest
import torch

from recipes.image_generation.logistic_mixture import (
    bin_log_probs,
    bits_per_dim,
    log_prob,
    nll_per_image,
    parameter_count,
    sample,
)

PAIRS = {1: [], 3: [(1, 0), (2, 0), (2, 1)]}   # coupling (channel, earlier channel), in layout order


def make_output(logits, means, log_scales, coeffs):
    """Network output in the documented layout from per-block arrays (..., K), (..., C, K),
    (..., C, K), (..., pairs, K)."""
    batch = logits.shape[:-1]
    flat = [logits, means.reshape(*batch, -1), log_scales.reshape(*batch, -1),
            coeffs.reshape(*batch, -1)]
    return torch.cat(flat, dim=-1)


def random_output(generator, shape, k, channels, dtype=torch.float64, log_scale=(-5.0, 0.5),
                  coupling=1.5):
    def uniform(*size, low, high):
        return low + (high - low) * torch.rand(*shape, *size, generator=generator, dtype=dtype)
    return make_output(2.0 * torch.randn(*shape, k, generator=generator, dtype=dtype),
                       uniform(channels, k, low=-1.3, high=1.3),
                       uniform(channels, k, low=log_scale[0], high=log_scale[1]),
                       uniform(len(PAIRS[channels]), k, low=-coupling, high=coupling))


def logistic_cdf(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def direct_bin_mass(level: int, mean: float, scale: float) -> float:
    """∫ over the bin of the logistic density, as CDF(upper) − CDF(lower) with the edge bins
    open (PixelCNN++, eq. 2); differences of survival functions in the right tail."""
    x = level / 127.5 - 1.0
    upper = math.inf if level == 255 else (x + 1 / 255 - mean) / scale
    lower = -math.inf if level == 0 else (x - 1 / 255 - mean) / scale
    if lower > 0:
        survival_upper = 0.0 if upper == math.inf else logistic_cdf(-upper)
        return logistic_cdf(-lower) - survival_upper
    cdf_lower = 0.0 if lower == -math.inf else logistic_cdf(lower)
    return (1.0 if upper == math.inf else logistic_cdf(upper)) - cdf_lower


def unpack(row: np.ndarray, channels: int):
    """One pixel's parameters from the layout, in plain float64."""
    k = len(row) // (1 + 2 * channels + len(PAIRS[channels]))
    logits = row[:k]
    means = row[k:k + channels * k].reshape(channels, k)
    log_scales = np.maximum(row[k + channels * k:k + 2 * channels * k].reshape(channels, k), -7.0)
    coeffs = np.tanh(row[k + 2 * channels * k:].reshape(-1, k))
    weights = np.exp(logits - logits.max())
    return weights / weights.sum(), means, np.exp(log_scales), coeffs


def direct_pixel_probability(row: np.ndarray, levels, channels: int) -> float:
    """Σ_k π_k Π_c P(level_c | μ_c + Σ_{j<c} α_{c,j} x_j, s_c) for one pixel (eq. 3)."""
    weights, means, scales, coeffs = unpack(row, channels)
    x = [v / 127.5 - 1.0 for v in levels]
    total = 0.0
    for k in range(len(weights)):
        term = weights[k]
        for c in range(channels):
            mean = means[c, k] + sum(coeffs[p, k] * x[j] for p, (cc, j) in enumerate(PAIRS[channels])
                                     if cc == c)
            term *= direct_bin_mass(int(levels[c]), mean, scales[c, k])
        total += term
    return total


def random_levels(generator, shape, channels):
    """Pixel levels with many edge values (0 and 255) among uniform ones."""
    levels = torch.randint(0, 256, (*shape, channels), generator=generator)
    edge = torch.rand(levels.shape, generator=generator)
    levels[edge < 0.2] = 0
    levels[edge > 0.8] = 255
    return levels


@pytest.mark.parametrize("channels", [1, 3])
def test_log_prob_matches_direct_float64_evaluation(make_generator, channels):
    generator = make_generator()
    output = random_output(generator, (3, 40), 4, channels)
    levels = random_levels(generator, (3, 40), channels)
    expected = torch.tensor([[math.log(direct_pixel_probability(output[b, t].numpy(),
                                                                levels[b, t].tolist(), channels))
                              for t in range(40)] for b in range(3)], dtype=torch.float64)
    assert (levels == 0).any() and (levels == 255).any()
    torch.testing.assert_close(log_prob(output, levels, channels), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(log_prob(output.float(), levels, channels).double(), expected,
                               rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(nll_per_image(output, levels, channels), -expected.sum(1),
                               rtol=1e-10, atol=1e-9)


def test_one_channel_accepts_levels_without_channel_axis(make_generator):
    generator = make_generator()
    output = random_output(generator, (2, 7), 3, 1)
    levels = random_levels(generator, (2, 7), 1)
    torch.testing.assert_close(log_prob(output, levels[..., 0], 1), log_prob(output, levels, 1))


@pytest.mark.parametrize("level", [0, 40, 128, 255])
def test_tiny_bin_masses_match_mpmath(level):
    """Bins far in the tail of a narrow logistic, where σ(a) − σ(b) underflows float64 (the
    mid-bin fallback region of openai/pixel-cnn): exact log-masses against mpmath at 1,100
    digits (masses down to e^-2200 are differences of CDFs that agree to ~950 digits)."""
    means = torch.tensor([-1.0, -0.3, 0.9, 1.0], dtype=torch.float64)
    log_scale = -7.0
    output = make_output(torch.zeros(4, 1, dtype=torch.float64), means[:, None],
                         torch.full((4, 1), log_scale, dtype=torch.float64), torch.zeros(4, 0))
    levels = torch.full((4,), level)

    def exact(mean):
        s, x, h = mpmath.exp(log_scale), mpmath.mpf(level) / mpmath.mpf(127.5) - 1, mpmath.mpf(1) / 255
        upper = mpmath.mpf(1) if level == 255 else 1 / (1 + mpmath.exp(-(x + h - mean) / s))
        lower = mpmath.mpf(0) if level == 0 else 1 / (1 + mpmath.exp(-(x - h - mean) / s))
        return float(mpmath.log(upper - lower))

    with mpmath.workdps(1100):
        expected = torch.tensor([exact(mpmath.mpf(float(m))) for m in means], dtype=torch.float64)
    assert expected.min() < -700        # σ(a) − σ(b) is below float64's range somewhere
    torch.testing.assert_close(log_prob(output, levels, 1), expected, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(log_prob(output.float(), levels, 1).double(), expected,
                               rtol=2e-6, atol=1e-4)


def test_all_256_bins_sum_to_one(make_generator):
    generator = make_generator()
    output = torch.cat([random_output(generator, (50,), 5, 1),
                        random_output(generator, (50,), 5, 1, log_scale=(-12.0, 6.0))])
    log_p = bin_log_probs(output)
    assert log_p.shape == (100, 256)
    torch.testing.assert_close(torch.logsumexp(log_p, -1), torch.zeros(100, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    every_level = torch.arange(256).expand(100, 256)
    torch.testing.assert_close(log_p, log_prob(output[:, None, :].expand(100, 256, 15), every_level, 1))


def interval_mass(low, high, mean, scale):
    """Mass of levels low..high under logistic(mean, scale) discretized with open edge bins
    (PixelCNN++, eq. 2): the bin masses telescope to CDF(upper edge) − CDF(lower edge)."""
    upper = np.where(high == 255, np.inf, (high / 127.5 - 1.0 + 1 / 255 - mean) / scale)
    lower = np.where(low == 0, -np.inf, (low / 127.5 - 1.0 - 1 / 255 - mean) / scale)
    return np.exp(-np.logaddexp(0.0, -upper)) - np.exp(-np.logaddexp(0.0, -lower))


@pytest.fixture(scope="module")
def rgb_pixel():
    """A two-component RGB pixel with strong couplings, its (red, green) marginal and the mass
    of each of 8×8×8 colour cells (32 levels a side), evaluated directly in float64 numpy from
    eq. 3's factorisation Σ_k π_k P_k(r) P_k(g | r) P_k(b ∈ cell | r, g)."""
    generator = torch.Generator().manual_seed(2017)
    output = random_output(generator, (), 2, 3, log_scale=(-3.5, -1.5), coupling=2.5)
    weights, means, scales, coeffs = unpack(output.numpy(), 3)
    levels = np.arange(256)
    x = levels / 127.5 - 1.0
    low, high = levels[::32], levels[31::32]
    pairs = np.zeros((256, 256))
    cells = np.zeros((8, 8, 8))
    for k in range(2):
        red = interval_mass(levels, levels, means[0, k], scales[0, k])
        green = interval_mass(levels[None], levels[None], (means[1, k] + coeffs[0, k] * x)[:, None],
                              scales[1, k])
        blue_mean = means[2, k] + coeffs[1, k] * x[:, None] + coeffs[2, k] * x[None, :]
        blue = interval_mass(low, high, blue_mean[..., None], scales[2, k])          # (r, g, cell)
        pairs += weights[k] * red[:, None] * green
        cells += (weights[k] * red[:, None, None] * green[..., None] * blue).reshape(
            8, 32, 8, 32, 8).sum((1, 3))
    assert abs(cells.sum() - 1.0) < 1e-12
    return output, torch.from_numpy(pairs), torch.from_numpy(cells)


def test_rgb_probabilities_over_blue_sum_to_the_red_green_marginal(rgb_pixel, make_generator):
    """Σ_b P(r, g, b) = P(r, g) for every level of b, at random (r, g) and the four corners."""
    output, pairs, _ = rgb_pixel
    chosen = torch.cat([torch.randint(0, 256, (60, 2), generator=make_generator()),
                        torch.tensor([[0, 0], [0, 255], [255, 0], [255, 255]])])
    blue = torch.arange(256)
    levels = torch.cat([chosen[:, None, :].expand(64, 256, 2), blue.expand(64, 256)[..., None]], -1)
    total = log_prob(output.expand(64, 256, -1), levels, 3).exp().sum(-1)
    torch.testing.assert_close(total, pairs[chosen[:, 0], chosen[:, 1]], rtol=1e-10, atol=1e-15)


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple:
    """Pearson's statistic over cells with expected count ≥ 5 (the rest pooled into one cell)
    and its degrees of freedom."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def assert_fits(observed, expected):
    """χ² below df + 6·√(2 df): a normal-approximation bound far in the tail for a correct
    sampler (fixed seed), well below the statistic of any of the wrong samplers tried below."""
    stat, df = chi_square(observed, expected)
    assert stat < df + 6 * math.sqrt(2 * df), (stat, df)


def assert_misfits(observed, expected):
    stat, df = chi_square(observed, expected)
    assert stat > df + 6 * math.sqrt(2 * df), (stat, df)


def test_one_channel_sampler_histogram_matches_bin_probabilities(make_generator):
    generator = make_generator()
    n = 200_000
    cases = [*random_output(generator, (2,), 3, 1, log_scale=(-4.0, -2.0)),
             make_output(torch.zeros(2), torch.tensor([[-1.05, 0.98]]), torch.tensor([[-3.0, -3.0]]),
                         torch.zeros(0, 2)).double()]
    for output in cases:
        probabilities = bin_log_probs(output).exp()
        draws = sample(output.expand(n, -1), 1, generator=generator)
        assert draws.shape == (n, 1) and draws.dtype == torch.int64
        counts = torch.bincount(draws[:, 0], minlength=256).double()
        assert_fits(counts, n * probabilities)
        assert_misfits(torch.roll(counts, 1), n * probabilities)   # an off-by-one level fails
    assert counts[0] > 1000 and counts[255] > 1000                   # the last case hits both edges


def test_rgb_sampler_matches_the_joint_with_coupling(rgb_pixel):
    output, _, cells = rgb_pixel
    cells = cells.flatten()
    n = 200_000
    generator = torch.Generator().manual_seed(3)

    def histogram(out):
        draws = sample(out.expand(n, -1), 3, generator=generator)
        cell = (draws // 32) * torch.tensor([64, 8, 1])
        return torch.bincount(cell.sum(-1), minlength=512).double()

    assert_fits(histogram(output), n * cells)
    uncoupled = output.clone()
    uncoupled[-6:] = 0.0                     # α = tanh(0) = 0: a sampler ignoring the coupling
    assert_misfits(histogram(uncoupled), n * cells)


def test_sampler_is_reproducible_and_follows_the_device_generator(make_generator):
    output = random_output(make_generator(), (5, 9), 3, 3)
    first = sample(output, 3, generator=torch.Generator().manual_seed(1))
    again = sample(output, 3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(first, again) and first.shape == (5, 9, 3)
    assert first.min() >= 0 and first.max() <= 255


def test_bits_per_dim_of_a_uniform_distribution_is_eight():
    dims = 28 * 28
    assert float(bits_per_dim(torch.tensor(dims * math.log(256.0)), dims)) == pytest.approx(8.0, abs=1e-12)


def test_bits_per_dim_of_an_even_spread_mixture_is_near_eight(make_generator):
    """256 equal components, one narrow logistic centred on each level: P(v) ≈ 1/256."""
    centres = torch.arange(256, dtype=torch.float64) / 127.5 - 1.0
    output = make_output(torch.zeros(256, dtype=torch.float64), centres[None],
                         torch.full((1, 256), -7.0, dtype=torch.float64), torch.zeros(0, 256))
    images = torch.randint(0, 256, (4, 196), generator=make_generator())
    nll = nll_per_image(output.expand(4, 196, -1), images, 1)
    assert torch.allclose(bits_per_dim(nll, 196), torch.full((4,), 8.0, dtype=torch.float64), atol=0.01)


def test_bits_per_dim_of_a_mixture_concentrated_on_the_data():
    """One narrow logistic (s = e^-7) centred on each pixel's own level: an interior bin has
    mass σ(h/s) − σ(−h/s) = tanh(h / 2s), an edge bin σ(h/s), h = 1/255 — near 0 bits/dim."""
    images = torch.tensor([[0, 255, 17, 128, 200, 0, 0, 3, 255]])
    means = images.double() / 127.5 - 1.0
    output = make_output(torch.zeros(1, 9, 1, dtype=torch.float64), means[..., None, None],
                         torch.full((1, 9, 1, 1), -7.0, dtype=torch.float64), torch.zeros(1, 9, 0, 1))
    a = math.exp(7.0) / 255
    per_pixel = [-math.log2(logistic_cdf(a)) if v in (0, 255) else -math.log2(math.tanh(a / 2))
                 for v in images[0].tolist()]
    found = bits_per_dim(nll_per_image(output, images, 1), 9)
    assert float(found) == pytest.approx(sum(per_pixel) / 9, rel=1e-12)
    assert float(found) < 0.05
    all_black = make_output(torch.zeros(1, 9, 1), torch.full((1, 9, 1, 1), -3.0),
                            torch.full((1, 9, 1, 1), -7.0), torch.zeros(1, 9, 0, 1))
    assert float(bits_per_dim(nll_per_image(all_black, torch.zeros(1, 9, dtype=torch.long), 1), 9)) < 1e-6


@pytest.mark.parametrize("channels", [1, 3])
def test_gradients_are_finite_at_the_edges_and_in_the_tails(channels):
    k = 4
    means = torch.tensor([-60.0, -1.0, 1.0, 60.0]).expand(1, 6, channels, k)
    log_scales = torch.tensor([-30.0, -7.0, 3.0, 60.0]).expand(1, 6, channels, k)
    output = make_output(torch.tensor([-50.0, 0.0, 20.0, 50.0]).expand(1, 6, k), means, log_scales,
                         torch.full((1, 6, len(PAIRS[channels]), k), 40.0))
    output.requires_grad_(True)
    levels = torch.tensor([0, 255, 1, 254, 128, 0])[None, :, None].expand(1, 6, channels)
    nll = nll_per_image(output, levels, channels)
    nll.sum().backward()
    assert torch.isfinite(nll).all()
    assert torch.isfinite(output.grad).all() and output.grad.abs().sum() > 0


def test_half_precision_output_is_evaluated_in_float32(make_generator):
    generator = make_generator()
    output = random_output(generator, (2, 11), 3, 3, dtype=torch.float32).bfloat16()
    levels = random_levels(generator, (2, 11), 3)
    found = log_prob(output, levels, 3)
    assert found.dtype == torch.float32
    torch.testing.assert_close(found, log_prob(output.float(), levels, 3))


def test_parameter_count():
    assert parameter_count(10, 1) == 30 and parameter_count(10, 3) == 100


@pytest.mark.parametrize("call, match", [
    (lambda: log_prob(torch.zeros(2, 29), torch.zeros(2, 3, dtype=torch.long), 3), "last dimension"),
    (lambda: log_prob(torch.zeros(2, 30, dtype=torch.long), torch.zeros(2, dtype=torch.long), 1),
     "output must be a floating-point tensor"),
    (lambda: log_prob(torch.zeros(2, 30), torch.zeros(2), 1), "target must be an integer tensor"),
    (lambda: log_prob(torch.zeros(2, 30), torch.zeros(3, dtype=torch.long), 1), "target must have shape"),
    (lambda: log_prob(torch.zeros(2, 100), torch.zeros(2, dtype=torch.long), 3), "target must have shape"),
    (lambda: log_prob(torch.zeros(2, 30), torch.tensor([0, 256]), 1), r"target must hold pixel levels"),
    (lambda: log_prob(torch.zeros(2, 30), torch.tensor([-1, 3]), 1), r"target must hold pixel levels"),
    (lambda: parameter_count(10, 0), "channels must be an integer >= 1"),
    (lambda: parameter_count(True, 1), "n_mix must be an integer >= 1"),
    (lambda: bits_per_dim(torch.ones(2), 0), "dims must be an integer >= 1"),
    (lambda: sample(torch.zeros(2, 31), 1), "last dimension"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
