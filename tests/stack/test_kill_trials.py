"""Kill -9 trials of a standing sink (tidemark_workshop.kill_trials), seeded, as in every CI run.

Twenty trials, as the streaming issue asks of every CI run: every moment of the micro-batch's life
(8 suffice: the rotation) and two batches between staging and commit; `make kill-trials` runs
longer campaigns (TRIALS=, SEED=). TIDEMARK_KILL_TRIALS and TIDEMARK_KILL_SEED change this one.
"""

from __future__ import annotations

import os

from tidemark_workshop import kill_trials

TRIALS = int(os.environ.get("TIDEMARK_KILL_TRIALS", "20"))
SEED = int(os.environ.get("TIDEMARK_KILL_SEED", "20261123"))


def test_every_input_has_exactly_one_effect_whenever_the_sink_is_killed(settings, tmp_path):
    campaign = kill_trials.run(settings, tmp_path, TRIALS, SEED)
    print(f"kill trials: {campaign.trials} trials, seed {campaign.seed}: {dict(campaign.kills)}")
    assert sum(campaign.kills.values()) == TRIALS >= 1
    if TRIALS >= 8:  # every moment of the micro-batch's life was hit
        assert set(campaign.kills) == {"timer", *kill_trials.POINTS}, campaign.kills
    assert not campaign.problems, campaign.problems
