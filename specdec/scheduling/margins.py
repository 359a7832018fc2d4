"""The speculation controller's margins, budgets and horizons (specdec.scheduling.control), each with the
measurement that set it: in one place, since the plan, its rests and its explorations all weigh by them."""

MIN_SECONDS = 1e-7
SWITCH_MARGIN = 0.1
# An exploration step must be able to win this much over the best known choice: its information is worth its
# price only when the gain it might reveal is material. Drafts that almost never land (p = 0.03) then leave a
# plain decoder alone, while a stale width with promising drafts still gets re-measured.
EXPLORE_GAIN = 0.1
SPECULATE_MARGIN = 0.05  # a speculative width must beat plain by this much (see plan)
PLAIN_FADE = 0.3  # how far a plain step ages the acceptance table, in verified steps
# A catch-up must pay for itself within this many steps: costs drift (context length, the machine), and a
# draft model woken for a short spell pays its prefill for nothing.
PAYBACK_STEPS = 8
PLAIN_FIRST = 3  # a new controller's first steps are plain: they measure what speculation must beat
# A drafter's first few verdicts are too few to believe either way: a drafter whose drafts land 75% of the time
# misses one of its first two 44% of the time. Until it has had MIN_VERDICTS, an exploration may hope for its
# acceptance (AcceptanceTable.hope), besides its stale costs (see plan). Traced on the demo pair's
# layer-skip draft at batch 1: one miss in its first two verdicts, and every cost measured cold in the first
# speculative steps (a step's overhead 2.9 ms, later 1.4), kept it plain for 200 steps.
MIN_VERDICTS = 4
