"""argparse value types shared by the MomentumLSTM recipes (lstm_tasks, mnist)."""
import argparse


def bounded_int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return bounded_int(text, 1)


def non_negative_int(text: str) -> int:
    return bounded_int(text, 0)
