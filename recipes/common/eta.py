"""Expected duration and a running ETA for a recipe made of known jobs (`make demo`).

Each job has an expected cost in seconds, measured on the reference machine (the 2-core CPU
machine, quiet). The plan is printed before anything runs; after each finished job the remaining
jobs' expected costs are scaled by how fast this machine has been so far (observed / expected),
so a loaded or faster machine gets an honest ETA after the first jobs. The pace starts from the
reference (1.0) with the weight of one typical job, so a short first job (setting up the data)
does not swing the estimate of the long ones."""
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Dict, List


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


@dataclass
class Schedule:
    """jobs: (name, expected seconds) in the order they will run."""

    jobs: List[tuple]
    log: Callable[[str], None] = print
    clock: Callable[[], float] = time.perf_counter
    started: float = 0.0
    done: Dict[str, float] = field(default_factory=dict)

    @property
    def expected(self) -> float:
        return sum(seconds for _, seconds in self.jobs)

    def start(self, reference: str) -> None:
        self.started = self.clock()
        parts: Dict[str, float] = {}
        for name, seconds in self.jobs:
            part = name.split(":")[0]
            parts[part] = parts.get(part, 0.0) + seconds
        detail = ", ".join(f"{part} {minutes(seconds)}" for part, seconds in parts.items())
        self.log(f"expected duration: {minutes(self.expected)} ({detail}; measured on {reference}); "
                 f"ETA {self._clock_time(self.expected)}")

    def finished(self, name: str) -> None:
        """Mark job `name` done and print the elapsed time and the ETA of the rest."""
        elapsed = self.clock() - self.started
        self.done[name] = elapsed
        spent_expected = sum(seconds for job, seconds in self.jobs if job in self.done)
        prior = max(seconds for _, seconds in self.jobs)          # one typical job at the reference pace
        pace = (elapsed + prior) / (spent_expected + prior)
        remaining = pace * sum(seconds for job, seconds in self.jobs if job not in self.done)
        self.log(f"[{len(self.done)}/{len(self.jobs)} done, {minutes(elapsed)} elapsed] "
                 f"{minutes(remaining)} left at this machine's pace ({pace:.2f}× the reference), "
                 f"ETA {self._clock_time(remaining)}")

    @staticmethod
    def _clock_time(seconds_from_now: float) -> str:
        return (datetime.now() + timedelta(seconds=seconds_from_now)).strftime("%H:%M")
