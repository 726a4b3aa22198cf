"""Kill -9 trials of a standing sink (tidemark_workshop.kill_trials), seeded: `make test`'s handful.

The moment of each trial follows its number (kill_trials.run): the first trial kills between staging
a batch and its commit, the next six take one turn of ``ROTATION`` (a timer, just before the
commit, a timer, between the commit and the dead-letter write, a timer, between the dead-letter
write and its mark). So seven trials are the fewest that reach every moment of the micro-batch's
life once; fewer miss one (four would stop before the two dead-letter moments). The seed chooses
the rest: with 20261123 the lifecycle kills fall on the first and the second pass through their
point, and the timers fire 11.0 s (mid-stream), 5.7 s and 3.4 s (starting) after the start.

`make kill-trials` runs the long campaigns (20 or more trials, TRIALS=, SEED=), as CI did before;
TIDEMARK_KILL_TRIALS and TIDEMARK_KILL_SEED change this one.
"""

from __future__ import annotations

import os

from tidemark_workshop import kill_trials

TRIALS = int(os.environ.get("TIDEMARK_KILL_TRIALS", "7"))
SEED = int(os.environ.get("TIDEMARK_KILL_SEED", "20261123"))
MOMENTS = {"timer", *kill_trials.POINTS}
EVERY_MOMENT = 1 + len(kill_trials.ROTATION)  # the first batch trial, then one turn of the rotation


def test_every_input_has_exactly_one_effect_whenever_the_sink_is_killed(settings, tmp_path):
    assert TRIALS >= EVERY_MOMENT, f"TIDEMARK_KILL_TRIALS={TRIALS}: {EVERY_MOMENT} trials reach every moment"
    lines: list[str] = []

    def log(line: str) -> None:
        print(line)
        lines.append(line)

    campaign = kill_trials.run(settings, tmp_path, TRIALS, SEED, log=log)
    print(f"kill trials: {campaign.trials} trials, seed {campaign.seed}: {dict(campaign.kills)}")
    assert sum(campaign.kills.values()) == TRIALS
    assert set(campaign.kills) == MOMENTS, campaign.kills
    # a lifecycle kill the job never reached falls back to kill -9 after 90 s: that trial tested a timer
    fell_back = [line for line in lines if "not reached" in line]
    assert not fell_back, fell_back
    assert not campaign.problems, campaign.problems
