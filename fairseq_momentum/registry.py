"""Registration that tolerates a second import of the user-dir.

fairseq imports a user-dir by path (`--user-dir`), and a test or script may also import
it as the installed package, which runs every `register_model_architecture` twice and
raises "Cannot register duplicate model architecture". These wrappers register a name
only once.
"""
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY, register_model, register_model_architecture


def model(name):
    def wrap(cls):
        if name in MODEL_REGISTRY:
            return cls
        return register_model(name)(cls)
    return wrap


def architecture(model_name, arch_name):
    def wrap(fn):
        if arch_name in ARCH_MODEL_REGISTRY:
            return fn
        return register_model_architecture(model_name, arch_name)(fn)
    return wrap
