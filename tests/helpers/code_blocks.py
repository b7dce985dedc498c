"""Running a block of code (a README example, a generated bundle) inside a test, as a module."""


def run_as_module(code: str, filename: str) -> dict:
    """Executes `code` in a fresh namespace whose `__name__` is `filename`, and returns the namespace.

    Without a `__name__`, a class defined in the code takes builtins' name as its module, and
    dataclasses then run their generated methods in builtins' own dict,
    which leaves `builtins.__dict__["__builtins__"]` holding that dict: in the same process a later
    torch.compile recursed without end (dynamo's realize_all) wherever it had to rebuild a generator.
    """
    namespace = {"__name__": filename}
    exec(compile(code, filename, "exec"), namespace)
    return namespace
