"""The speculation controller's decision for one step: the verify width and per-row draft counts, with what it
predicted and priced (SpeculationController.plan makes it; the decode loop and the early stop read it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Plan:
    """The controller's decision for one step (see SpeculationController.plan)."""
    width: int  # verify width w: the target forward covers [last, d_1 .. d_{w-1}]; 1 = plain step
    num_draft: list[int]  # per row, drafts to verify (<= width - 1)
    predicted_tokens: float
    predicted_seconds: float
    explore: bool = False
    probs: list[list[float]] = field(default_factory=list)  # per row, p[b, i] for its drafted positions
    # per row, v_b in units of an average token (c(B) / B seconds of plain decoding); None: every token alike
    worth: list[float] | None = None
    predicted_value: float = 0.0  # sum_b v_b E_b for the chosen counts (= predicted_tokens when worth is None)
    # what plan priced, for keep_drafting's stand (_drafting_memo) when the tables have not changed since: (the
    # acceptance table's version, per row its factor, per row p[b, i] for every offered draft, per row its keys,
    # the target's cost by width - 1)
    priced: tuple | None = None

    @property
    def plain(self) -> bool:
        return self.width == 1
