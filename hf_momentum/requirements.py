"""The oldest transformers this package runs on, checked when it is imported: below it the import
fails naming the version to install, not with an AttributeError in the middle of `generate`
(5.17, say, has no `Cache.is_recording_past`, which speculative decoding's cache relies on)."""
import transformers
from packaging.version import Version

TRANSFORMERS_MIN = "5.23"          # setup.cfg's `hf` extra: transformers>=5.23,<6


def check_transformers(version: str = transformers.__version__) -> None:
    if Version(version) < Version(TRANSFORMERS_MIN):
        raise ImportError(f"hf_momentum needs transformers>={TRANSFORMERS_MIN},<6 and found {version}: "
                          f"pip install 'transformers>={TRANSFORMERS_MIN},<6'")


check_transformers()
