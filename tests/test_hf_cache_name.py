"""transformers 5.24 renamed the generation cache from `past_key_values` to `cache` (a model's
argument, its outputs' field, generate()'s model_kwargs and the Trainer's keys to ignore). The
native models take either name and answer under the installed version's (hf_momentum.modeling_common.
CACHE_NAME): checked here on whichever transformers runs the suite (the lock's in make test; the
newest in `make latest-test`)."""
import numpy as np
import pytest
import torch
import transformers
from helpers.hf_tiny_models import FAMILIES, causal_lm, left_padded
from packaging.version import Version
from transformers import Trainer, TrainingArguments

from hf_momentum.modeling_common import CACHE_NAME


def test_the_cache_name_is_the_installed_transformers_one():
    renamed = Version(transformers.__version__).release >= (5, 24)
    assert CACHE_NAME == ("cache" if renamed else "past_key_values")


@pytest.mark.parametrize("family", FAMILIES)
def test_either_name_continues_the_cache_and_the_output_holds_it_under_the_installed_name(family,
                                                                                       make_generator):
    model = causal_lm(family)
    ids, mask = left_padded(make_generator(), [7, 4], 7)
    with torch.no_grad():
        whole = model(input_ids=ids, attention_mask=mask).logits
        continued = {}
        for name in ("cache", "past_key_values"):
            prefix = model(input_ids=ids[:, :4], attention_mask=mask[:, :4], use_cache=True)
            cache = getattr(prefix, CACHE_NAME)
            assert cache is not None and prefix[CACHE_NAME] is cache
            out = model(input_ids=ids[:, 4:], attention_mask=mask, **{name: cache})
            assert out[CACHE_NAME] is cache and cache.get_seq_length() == ids.shape[1]
            continued[name] = out.logits
        with pytest.raises(ValueError, match="pass the cache once"):
            model(input_ids=ids[:, 4:], attention_mask=mask, cache=cache, past_key_values=cache)
    torch.testing.assert_close(continued["cache"], continued["past_key_values"], rtol=0, atol=0)
    real = mask[:, 4:].bool()
    torch.testing.assert_close(continued["cache"][real], whole[:, 4:][real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_predict_returns_the_logits_without_the_cache(family, tmp_path, make_generator):
    """Trainer.prediction_step drops the output keys in `config.keys_to_ignore_at_inference`; the
    cache the model returns in eval mode with use_cache (the Trainer sets the config's from its
    arguments) must be among them under the installed name, or it is gathered with the logits."""
    model = causal_lm(family)
    ids = torch.randint(3, 60, (4, 6), generator=make_generator())
    rows = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[],
                             use_cpu=True, use_cache=True)
    predictions = Trainer(model=model, args=args).predict(rows).predictions
    assert model.config.use_cache
    assert isinstance(predictions, np.ndarray)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    torch.testing.assert_close(torch.as_tensor(predictions), expected, rtol=1e-5, atol=1e-5)
