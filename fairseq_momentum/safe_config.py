"""Config strings of a fairseq checkpoint are read as literals, never run as code.

fairseq turns some config strings into values with Python's `eval`: transformer_lm's and
lightconv_lm's `character_filters`, fconv's layer lists, the optimizers' betas, wav2vec's
conv layers, and every field passed through `fairseq.utils.eval_str_list` / `eval_str_dict` /
`eval_bool` (`adaptive_softmax_cutoff`, lstm's `decoder_attention`, `xformers_att_config`,
`left_pad_source`, ...). Those strings come from the checkpoint's stored config when
fairseq-generate, -eval-lm, -interactive or `checkpoint_utils.load_model_ensemble_and_task`
build its model, and the checkpoint also chooses the architecture, so with
`--user-dir fairseq_momentum` any of fairseq's own models is reachable: one crafted file ran
arbitrary code. torch's weights_only unpickler (fairseq_momentum/checkpoints.py) cannot help
here, since the payload is a plain string.

Two layers, both installed when the user-dir is imported (fairseq imports `--user-dir`
before it loads any checkpoint):

1. Checked on load. fairseq's `load_checkpoint_to_cpu` hands the freshly unpickled state
   (with the caller's overrides applied) to `_upgrade_state_dict` before anything reads the
   config; the wrapper of that function walks the stored config (`args` as an
   argparse.Namespace, `cfg` as a dict or an omegaconf DictConfig, with Namespaces or
   nested configs inside, e.g. wav2vec's `w2v_args`) and refuses, with an
   `UnsafeConfigError` (a ValueError) naming every offending field, any value of an
   EVALUATED_FIELDS field that is not a literal. The check happens before the model, the
   task or the optimizer is built, so before fairseq's own eval could run. EVALUATED_FIELDS
   is every field name that the installed fairseq evaluates (tests/fairseq_eval_sites.py
   finds them in its source; a test fails when fairseq gains one that is not listed).
2. No eval at all. Every fairseq module that calls the builtin `eval` on config values
   gets a module-level `eval` that only reads literals (a module global shadows the
   builtin), `fairseq.utils` included, so `eval_str_list` / `eval_str_dict` / `eval_bool`
   and the argparse types bound to them in `fairseq.options` and the models are safe too.
   This covers what layer 1 cannot see: a state handed to `load_model_ensemble_and_task`
   without going through the loader, a field fairseq reaches by another name.

Replacing the functions was not enough on its own: `fairseq.options` and the models bind
`eval_str_list` by name at import, and the raw `eval(args.character_filters)` of
transformer_lm is no function to replace. Layer 1 exists for the error message: it names
the field and the checkpoint, where layer 2 only sees a string.

A literal is what `ast.literal_eval` accepts (numbers, strings, bytes, booleans, None,
tuples, lists, dicts, sets), plus the repetition and concatenation of list or tuple
literals (`[(512, 3)] * 20`, `[(512, 10, 5)] + [(512, 3, 2)] * 4`) that fconv's and
wav2vec's own defaults are written in, capped at MAX_ITEMS elements so a crafted
`[0] * 10**12`-style string cannot exhaust memory. Empty strings pass the check (eval of
one raises SyntaxError, as fairseq already does). Values that are not strings are not
evaluated by fairseq and pass unchanged.

The same walk refuses, in every field, an omegaconf interpolation or resolver (`${oc.env:SECRET}`
in a URL field sent a secret over the network, issue 28) unless FAIRSEQ_MOMENTUM_ALLOW_INTERPOLATION=1,
and nesting deeper than MAX_DEPTH; values are read unresolved, omegaconf nodes and containers
included. The check runs again after fairseq upgrades a legacy `args` into a `cfg`, and before it,
every registry name of the config (architecture, task, criterion, optimizer, bpe, ...) must be
registered: fairseq turns a legacy name into a Hydra config group choice, a yaml path.

Not covered here: fairseq's `eval` of data-file lines (`fairseq.data.codedataset`), which are
no checkpoint config.
"""
import argparse
import ast
import functools
import importlib
import os
from typing import Iterator, List, Tuple

from fairseq import checkpoint_utils
from omegaconf import DictConfig, ListConfig
from omegaconf.nodes import ValueNode

MAX_ITEMS = 100_000
MAX_DEPTH = 100
ALLOW_INTERPOLATION = "FAIRSEQ_MOMENTUM_ALLOW_INTERPOLATION"

# Field names whose string values the installed fairseq (fairseq/ and fairseq/examples/) evaluates
# with eval, eval_str_list, eval_str_dict or eval_bool, directly or as an argparse type.
EVALUATED_FIELDS = frozenset({
    "adafactor_eps", "adam_betas", "adamax_betas", "lamb_betas",
    "adaptive_input_cutoff", "adaptive_softmax_cutoff",
    "character_filters", "conv_aggregator_layers", "conv_dec_config", "conv_enc_config",
    "conv_feature_layers", "decoder_attention", "decoder_glu", "decoder_kernel_size_list",
    "decoder_layers", "decoder_zero_init", "downsample", "encoder_attention", "encoder_glu",
    "encoder_kernel_size_list", "encoder_layers", "extra_data", "extra_lang_pairs",
    "feature_encoder_spec", "gated_attention", "langtoks", "left_pad_source", "left_pad_target",
    "model_overrides", "pipeline_balance", "pipeline_decoder_balance", "pipeline_decoder_devices",
    "pipeline_devices", "pipeline_encoder_balance", "pipeline_encoder_devices", "pretrained",
    "project_input", "sampling_weights", "self_attention", "transformer_context",
    "transformer_dec_config", "transformer_enc_config", "transformer_sampling",
    "vggblock_enc_config", "weight_softmax", "wer_args", "xformers_att_config",
})
# fairseq flattens nested configs into `<part>_<field>` in a Namespace (TransformerConfig's
# decoder.xformers_att_config is args.decoder_xformers_att_config).
FLATTENED_PREFIXES = ("encoder_", "decoder_", "quant_noise_")

# The fairseq modules that call the builtin eval on config values (layer 2).
EVALUATING_MODULES = (
    "fairseq.utils",
    "fairseq.criterions.ctc",
    "fairseq.data.audio.raw_audio_dataset",
    "fairseq.models.fconv", "fairseq.models.fconv_lm", "fairseq.models.fconv_self_att",
    "fairseq.models.hubert.hubert", "fairseq.models.lightconv_lm",
    "fairseq.models.speech_to_text.s2t_wav_transformer", "fairseq.models.transformer_lm",
    "fairseq.models.wav2vec.wav2vec", "fairseq.models.wav2vec.wav2vec2",
    "fairseq.optim.adafactor", "fairseq.optim.adam", "fairseq.optim.adamax", "fairseq.optim.cpu_adam",
    "fairseq.optim.fused_lamb",
)


class UnsafeConfigError(ValueError):
    """A config string that fairseq would evaluate is not a literal."""


def _sequence(node: ast.AST):
    value = _value(node)
    if not isinstance(value, (list, tuple)):
        raise ValueError("only lists and tuples may be repeated or concatenated")
    return value


def _repeated(node: ast.BinOp):
    """`seq * n` or `n * seq` with an int n >= 0, within MAX_ITEMS elements."""
    seq_node, count_node = (node.left, node.right) if isinstance(node.right, ast.Constant) else (
        node.right, node.left)
    count = _value(count_node)
    if type(count) is not int or count < 0:
        raise ValueError("a sequence may only be repeated a non-negative int number of times")
    seq = _sequence(seq_node)
    if len(seq) * count > MAX_ITEMS:
        raise ValueError(f"more than {MAX_ITEMS} elements")
    return seq * count


def _value(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        if not isinstance(node, ast.BinOp):
            raise
    if isinstance(node.op, ast.Mult):
        return _repeated(node)
    if not isinstance(node.op, ast.Add):
        raise ValueError(f"operator {type(node.op).__name__} in a literal")
    left, right = _sequence(node.left), _sequence(node.right)
    if type(left) is not type(right) or len(left) + len(right) > MAX_ITEMS:
        raise ValueError("only a list to a list or a tuple to a tuple, within the size limit")
    return left + right


def literal(text):
    """The value of `text` if it is a literal (see the module docstring), else ValueError."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return _value(ast.parse(text.lstrip(" \t"), mode="eval").body)


def literal_eval_builtin(source, globals=None, locals=None):
    """Stand-in for the builtin `eval` in fairseq's evaluating modules: the same TypeError
    for a non-string and SyntaxError for an empty one, a literal's value, and for anything
    else a ValueError that says no code from configs is run."""
    if not isinstance(source, (str, bytes)):
        raise TypeError(f"eval() arg 1 must be a string, bytes or code object, not {type(source).__name__}")
    try:
        return literal(source)
    except SyntaxError:
        raise
    except (ValueError, TypeError, RecursionError, MemoryError) as error:
        raise UnsafeConfigError(
            f"fairseq asked to evaluate {_shown(source)}, which is not a literal ({error}); with "
            "fairseq_momentum imported, config strings are read as literals only (numbers, strings, "
            "booleans, None, lists, tuples, dicts) and never run as code") from None


def _shown(value, limit=80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...'"


def is_evaluated(name) -> bool:
    if not isinstance(name, str):
        return False
    if name in EVALUATED_FIELDS:
        return True
    return any(name.startswith(p) and name[len(p):] in EVALUATED_FIELDS for p in FLATTENED_PREFIXES)


def _raw(value):
    """A value node's stored value, unresolved (an interpolation stays its `${...}` text)."""
    if isinstance(value, ValueNode):
        return value._value()
    return value


def _children(node) -> Iterator[Tuple[str, object]]:
    if isinstance(node, DictConfig):
        if not node._is_none() and not node._is_missing() and not node._is_interpolation():
            yield from ((str(k), _raw(node._get_node(k))) for k in node.keys())
    elif isinstance(node, ListConfig):
        if not node._is_none() and not node._is_missing() and not node._is_interpolation():
            yield from ((f"[{i}]", _raw(node._get_node(i))) for i in range(len(node)))
    elif isinstance(node, argparse.Namespace):
        yield from ((str(k), _raw(v)) for k, v in vars(node).items())
    elif isinstance(node, dict):
        yield from ((str(k), _raw(v)) for k, v in node.items())
    elif isinstance(node, (list, tuple)):
        yield from ((f"[{i}]", _raw(v)) for i, v in enumerate(node))


def _is_safe(value) -> bool:
    if not isinstance(value, (str, bytes)) or not value.strip():
        return True
    try:
        literal(value)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError, UnicodeDecodeError):
        return False
    return True


def _interpolation(value):
    """The `${...}` text of an interpolation or resolver call (a container node's too), else None."""
    if isinstance(value, (DictConfig, ListConfig)) and value._is_interpolation():
        return value._value()
    if isinstance(value, str) and "${" in value:
        return value
    return None


def interpolations_allowed() -> bool:
    return os.environ.get(ALLOW_INTERPOLATION, "") == "1"


def unsafe_fields(config, path: str = "cfg") -> List[Tuple[str, object, str]]:
    """(dotted path, value, rule) of every field under `config` that breaks a rule: an evaluated field
    that is not a literal, an interpolation anywhere (unless allowed), nesting deeper than MAX_DEPTH."""
    found, seen, stack = [], set(), [(path, _raw(config), 0)]
    allow = interpolations_allowed()
    while stack:
        where, node, depth = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > MAX_DEPTH:
            found.append((where, "...", f"nested deeper than {MAX_DEPTH} levels"))
            continue
        for name, value in _children(node):
            child = f"{where}.{name}" if not name.startswith("[") else where + name
            if is_evaluated(name) and not _is_safe(value):
                found.append((child, value, "not a literal, and fairseq evaluates this field"))
            elif not allow and _interpolation(value) is not None:
                found.append((child, _interpolation(value), "an omegaconf interpolation or resolver, which "
                              f"could read the environment or files (set {ALLOW_INTERPOLATION}=1 to allow)"))
            stack.append((child, value, depth + 1))
    return sorted(found, key=lambda item: item[0])


def _registries():
    import fairseq.data.encoders  # noqa: F401  (registers bpe and tokenizer)
    import fairseq.scoring  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY
    named = {"task": TASK_REGISTRY, **{k: v["registry"] for k, v in REGISTRIES.items()}}
    return named, ARCH_MODEL_REGISTRY, MODEL_REGISTRY


def _get(node, key):
    if isinstance(node, DictConfig):
        return _raw(node._get_node(key)) if key in node else None
    if isinstance(node, argparse.Namespace):
        return getattr(node, key, None)
    return node.get(key) if isinstance(node, dict) else None


def unregistered_choices(state) -> List[Tuple[str, object, str]]:
    """Architecture, task, criterion, optimizer, bpe, ... names that no registry holds. A legacy `args`
    name becomes a Hydra config group choice (a yaml file path) when fairseq upgrades it, so this
    runs before the upgrade."""
    named, archs, models = _registries()
    found = []

    def check(where, value, registry, what):
        if value is not None and (not isinstance(value, str) or value not in registry):
            choices = ", ".join(sorted(registry))
            found.append((where, value, f"not a registered {what}; registered: {choices}"))

    args, cfg = _get(state, "args"), _get(state, "cfg")
    if isinstance(args, argparse.Namespace):
        check("args.arch", _get(args, "arch"), archs, "architecture")
        for key, registry in named.items():
            check(f"args.{key}", _get(args, key), registry, key)
    if isinstance(cfg, (dict, DictConfig)):
        model = _get(cfg, "model")
        if isinstance(model, argparse.Namespace):
            check("cfg.model.arch", _get(model, "arch"), archs, "architecture")
        elif model is not None:
            check("cfg.model._name", _get(model, "_name"), {**archs, **models}, "architecture or model")
        for key, registry in named.items():
            section = _get(cfg, key)
            if section is not None:
                check(f"cfg.{key}._name", _get(section, "_name"), registry, key)
    return found


def check_state(state) -> None:
    """Raise UnsafeConfigError naming each field of the checkpoint's `args` / `cfg` that breaks a rule
    of unsafe_fields, or names an unregistered architecture, task, criterion, optimizer, bpe, ..."""
    found = []
    for key in ("args", "cfg"):
        if isinstance(state, dict) and state.get(key) is not None:
            found += unsafe_fields(state[key], key)
    if found:
        fields = "; ".join(f"{where} = {_shown(value)} ({rule})" for where, value, rule in found)
        raise UnsafeConfigError(
            f"refusing to load a fairseq checkpoint whose config holds code or references: {fields}. "
            "fairseq would run evaluated strings with eval; only literals (numbers, strings, booleans, None, "
            "lists, tuples, dicts) are accepted there. If the file is yours, fix the field (e.g. through "
            "--model-overrides or checkpoint_utils' arg_overrides).")
    unknown = unregistered_choices(state) if isinstance(state, dict) else []
    if unknown:
        named = "; ".join(f"{where} = {_shown(value)} is {rule}" for where, value, rule in unknown)
        raise UnsafeConfigError(named + ". Import the --user-dir that registers it, or fix the field.")


def checked_upgrade(upgrade):
    """Wrap fairseq's `_upgrade_state_dict(state)`: the config is checked before it is used."""

    @functools.wraps(upgrade)
    def _upgrade_state_dict(state):
        check_state(state)
        state = upgrade(state)
        check_state(state)      # the legacy args -> cfg upgrade wrote a new config
        return state

    _upgrade_state_dict.checks_config = True
    return _upgrade_state_dict


def _shadow_eval(module_name: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return      # a module that cannot be imported (a missing optional dependency) evaluates nothing
    module.eval = literal_eval_builtin


def install() -> None:
    """Both layers, once per process (the user-dir may be imported twice)."""
    if not getattr(checkpoint_utils._upgrade_state_dict, "checks_config", False):
        checkpoint_utils._upgrade_state_dict = checked_upgrade(checkpoint_utils._upgrade_state_dict)
    for name in EVALUATING_MODULES:
        _shadow_eval(name)
