"""hf_momentum.decode_step.ExportableDecodeStep: one decoding step as a function of explicit states,
exported with torch.export and a dynamic batch. Its program equals the eager cached model step for
step (greedy tokens after a left-padded eager prefill, at the traced batch and another), and a
prompt fed token by token from `initial_states` gives the prefill's logits; hybrids and models
without a recurrent cache are refused."""
import re
from pathlib import Path

import pytest
import torch
from helpers.code_blocks import run_as_module
from helpers.hf_tiny_models import FAMILIES, causal_lm, left_padded
from torch.export import Dim, export

from hf_momentum.decode_step import ExportableDecodeStep

STEPS = 4


def prefill(model, ids, mask):
    cache = model.cache_class(model.config)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    return out.logits[:, -1], cache


def exported(step, state, token):
    rows = Dim("batch", min=1, max=64)
    shapes = ({0: rows}, {0: rows}, tuple({0: rows} for _ in state[1:]))
    return export(step, (token, *state), dynamic_shapes=shapes, strict=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_step_equals_the_eager_cached_steps(family):
    model = causal_lm(family).double()
    step = ExportableDecodeStep(model)
    ids, mask = left_padded(torch.Generator().manual_seed(0), [6, 3, 1], 6)
    logits, cache = prefill(model, ids, mask)
    program = exported(step, step.states_of(cache), logits.argmax(-1, keepdim=True))
    for seed, lengths in ((0, [6, 3, 1]), (1, [2, 7, 7, 4, 5])):          # the traced batch, then another
        ids, mask = left_padded(torch.Generator().manual_seed(seed), lengths, max(lengths))
        logits, cache = prefill(model, ids, mask)
        state = step.states_of(cache)
        for _ in range(STEPS):
            token = logits.argmax(-1, keepdim=True)
            got, *state = program.module()(token, *state)
            mask = torch.cat([mask, torch.ones_like(token)], 1)
            with torch.no_grad():
                logits = model(input_ids=token, attention_mask=mask, past_key_values=cache,
                               use_cache=True).logits[:, -1]
            torch.testing.assert_close(got, logits, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_fed_token_by_token_from_initial_states_gives_the_prefills_logits(family):
    model = causal_lm(family).double()
    step = ExportableDecodeStep(model)
    ids = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(2))
    state = step.initial_states(2)
    assert all(not t.any() for t in state)
    with torch.no_grad():
        for i in range(ids.shape[1]):
            logits, *state = step(ids[:, i:i + 1], *state)
        whole = model(input_ids=ids, use_cache=False).logits[:, -1]
    torch.testing.assert_close(logits, whole, rtol=1e-9, atol=1e-9)
    assert state[0].tolist() == [7, 7]


def test_hybrids_and_other_models_are_refused():
    hybrid = causal_lm("transformer", layer_types=["linear_attention", "full_attention"])
    with pytest.raises(ValueError, match=r"layer_types has softmax layers \(\[1\]\)"):
        ExportableDecodeStep(hybrid)
    with pytest.raises(ValueError, match="MomentumTransformerForCausalLM or MomentumLSTMForCausalLM"):
        ExportableDecodeStep(torch.nn.Linear(2, 2))


def test_readme_decoder_export_example_runs_and_greedy_decodes():
    """The README's example as written; its tokens are those of eager greedy generate()."""
    text = (Path(__file__).resolve().parents[1] / "hf_momentum" / "README.md").read_text(encoding="utf-8")
    section = text.split("**Exporting a decoder for a runtime", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = run_as_module(code, "hf_momentum/README.md")
    model = namespace["model"]
    with torch.no_grad():
        generated = model.generate(torch.tensor([[5]]), attention_mask=torch.ones(1, 1, dtype=torch.long),
                                   max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert namespace["tokens"] == generated[0, 1:].tolist()
