"""What each compiled Triton kernel's code is, to show that a change to the kernels' source leaves the
machine code alone (tests/triton_launch_check.py --ptx-record / --same-ptx-as): a kernel is keyed by
its name, input dtype, constexprs, signature, warps and stages, and its code is the PTX without what
moves with the source's line numbers (line info, debug sections, comments)."""
import hashlib
import json
from pathlib import Path

# Lines that follow the source's layout, not the code: line info, file names, comments, and the labels
# only line info refers to.
_LAYOUT = (".loc", ".file", "//", "$L__tmp", "$L__func")


def code_fingerprint(ptx: str) -> str:
    """A hash of the PTX's instructions and declarations, the same wherever the source lines moved."""
    code = ptx.split("\t.section\t.debug")[0]
    kept = [line.rstrip() for line in code.splitlines()
            if line.strip() and not line.lstrip().startswith(_LAYOUT)]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def write(path, rows: list[dict]) -> None:
    """Rows of {"key", "label", "code", "registers", "spills"} as JSON: the label is the key without the
    signature, for people."""
    Path(path).write_text(json.dumps(sorted(rows, key=lambda row: (row["key"], row["code"])), indent=1))


def differences(before: list[dict], after: list[dict]) -> list[str]:
    """One line per kernel key whose compiled code differs between two records (or that only one has),
    by its label, with registers and spills where they changed; [] where every kernel compiled to the
    same code."""
    def by_key(rows):
        keyed = {}
        for row in rows:
            keyed.setdefault(row["key"], []).append(row)
        return keyed

    old, new = by_key(before), by_key(after)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        label = (old.get(key) or new[key])[0]["label"]
        if key not in new or key not in old:
            lines.append(f"{label}: compiled only {'before' if key in old else 'after'}")
            continue
        # as sets: one code may be held twice (Triton's own dispatch and the direct launcher key
        # their compiled kernels apart when one passes the compile options the other leaves implicit)
        codes_before, codes_after = {r["code"] for r in old[key]}, {r["code"] for r in new[key]}
        if codes_before == codes_after:
            continue
        gone = [r for r in old[key] if r["code"] not in codes_after] or old[key]
        came = [r for r in new[key] if r["code"] not in codes_before] or new[key]
        (r0, s0), (r1, s1) = [(r["registers"], tuple(r["spills"])) for r in (gone[0], came[0])]
        change = "" if (r0, s0) == (r1, s1) else f" (registers {r0} → {r1}, spills {s0} → {s1})"
        lines.append(f"{label}: other code{change}")
    return lines
