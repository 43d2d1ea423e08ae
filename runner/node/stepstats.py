"""What a rank measures of its steps: their phases, rows, real tokens and loss, and the steady rate
once the untimed warm-up steps (kernel set-up, a compile) are past.
"""

import contextlib
import math
import time
from dataclasses import dataclass, field

# Where a rank's step goes: collate, forward and backward (with DDP's overlapped all-reduce in
# --allreduce overlap); waiting for the slowest rank to finish its backward; the gradient
# all-reduce; the optimizer and schedule; and the whole step.
PHASES = ("compute_s", "wait_s", "comm_s", "optimizer_s", "step_s")


@dataclass
class StepStats:
    """The steps this process ran: what the log and results.json report of speed and loss."""
    warmup_steps: int  # the first steps of this process (kernel setup, compile), left out of the steady rate
    # A compiled job's first steps run eager where no note holds a rank's eager rate (compile_policy's
    # eager_probe_steps), or while a cold compile runs beside the training (to the step every node's is done):
    # measured apart, their own warm-up first; the compiled steps' warm-up follows them.
    eager_steps: int = 0
    eager_seconds: float = 0.0
    eager_steady_tokens: int = 0
    eager_steady_seconds: float = 0.0
    steps_run: int = 0
    samples: int = 0  # all ranks together
    tokens: int = 0  # real (unpadded) tokens, all ranks together
    seconds: float = 0.0
    steady_samples: int = 0
    steady_tokens: int = 0
    steady_seconds: float = 0.0
    first_loss: float | None = None
    last_loss: float | None = None
    epoch_loss: float = 0.0  # summed over the epoch's steps, also those before a mid-epoch stop
    epoch_steps: int = 0
    epoch_rows: int = 0  # all ranks', in the steps this process ran of the epoch
    epoch_tokens: int = 0  # real tokens of those rows
    phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))  # this rank's steady seconds in each


    def timeline(self) -> dict[str, float]:
        """This rank's mean seconds per steady step in each phase."""
        steady = max(1, self.steady_steps)
        return {key: round(value / steady, 4) for key, value in self.phases.items()}

    @property
    def probing(self) -> bool:
        """Whether the next step is one of the eager ones."""
        return self.steps_run < self.eager_steps

    @property
    def ran_compiled(self) -> bool:
        """Whether any step ran past the eager ones: a compiled job's compile happened."""
        return self.steps_run > self.eager_steps

    @property
    def steady_steps(self) -> int:
        return max(0, self.steps_run - self.eager_steps - self.warmup_steps)

    @property
    def eager_steady_steps(self) -> int:
        """The eager steps run past their own warm-up: those eager_steady_seconds timed."""
        return max(0, min(self.eager_steps, self.steps_run) - self.warmup_steps)

    @property
    def untimed_steps(self) -> int:
        """The steps run after the eager ones and before the steady ones: the compile's, for one."""
        return min(self.warmup_steps, max(0, self.steps_run - self.eager_steps))

    def record(self, phases: dict[str, float], samples: int, tokens: int, loss: float) -> None:
        seconds = phases["step_s"]
        self.steps_run += 1
        self.epoch_rows += samples
        self.epoch_tokens += tokens
        self.samples += samples
        self.tokens += tokens
        self.seconds += seconds
        if self.steps_run <= self.eager_steps:
            self.eager_seconds += seconds
            if self.steps_run > self.warmup_steps:
                self.eager_steady_tokens += tokens
                self.eager_steady_seconds += seconds
        elif self.steps_run > self.eager_steps + self.warmup_steps:
            self.steady_samples += samples
            self.steady_tokens += tokens
            self.steady_seconds += seconds
            for key in PHASES:
                self.phases[key] += phases[key]
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.last_loss = loss
        self.epoch_loss += loss
        self.epoch_steps += 1

    def start_epoch(self, position: dict) -> None:
        self.epoch_loss, self.epoch_steps = position["loss"], position["steps"]
        self.epoch_rows = self.epoch_tokens = 0

    def position(self, batch: int) -> dict:
        return {"batch": batch, "loss": self.epoch_loss, "steps": self.epoch_steps}

    def rates(self) -> dict[str, float]:
        def per_second(n: float, seconds: float) -> float:
            return round(n / seconds, 3) if seconds else 0.0
        return {"samples_per_second": per_second(self.samples, self.seconds),
                "steady_samples_per_second": per_second(self.steady_samples, self.steady_seconds),
                "steady_tokens_per_second": per_second(self.steady_tokens, self.steady_seconds)}


@contextlib.contextmanager
def timed(seconds: dict[str, float], stage: str):
    """Adds the block's wall seconds to seconds[stage]: where a job's time goes besides its steps
    (`ftc bench end-to-end` splits a job's wall time by them)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = round(seconds.get(stage, 0.0) + time.perf_counter() - start, 3)


def finite(value: float | None) -> float | None:
    """A loss as results.json holds it: a run that diverged (NaN, inf) says null, since strict
    JSON has no NaN and every JSON ftc writes is strict."""
    return value if value is None or math.isfinite(value) else None
