"""On PYTHONPATH with MOMENTUM_TRITON_SPECS_LOG set (benchmarks/gpu_call.sh), every Python process
records the Triton specialisations it compiles or loads (benchmarks/triton_specs.py). It shadows
any other sitecustomize on the path: the device's image needs none. A failure here never stops the
process."""
import os

if os.environ.get("MOMENTUM_TRITON_SPECS_LOG"):
    try:
        import importlib.util

        _spec = importlib.util.spec_from_file_location(
            "triton_specs", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         "triton_specs.py"))
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        _module.install(os.environ["MOMENTUM_TRITON_SPECS_LOG"])
    except Exception as error:  # noqa: BLE001  (a recorder must not break the run it watches)
        import sys
        print(f"triton_specs: not recording ({type(error).__name__}: {error})", file=sys.stderr)
