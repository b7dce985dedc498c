"""`python -m fairseq_momentum` prints the directory to pass as fairseq's --user-dir.

fairseq resolves --user-dir as a path; with an editable install the package is not under
site-packages, so from any directory use:

    fairseq-train DATA --user-dir "$(python -m fairseq_momentum)" --arch ...
"""
from pathlib import Path


def user_dir() -> str:
    return str(Path(__file__).resolve().parent)


if __name__ == "__main__":
    print(user_dir())
