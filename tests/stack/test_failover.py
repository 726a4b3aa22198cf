"""A seeded failover trial of each kind on a replicated site (three Kafka nodes, a Spark master and two
workers beside the stack): the partition leader killed, a broker stopped, a Spark worker killed, each under
writers, a standing events stream and a reader of the serving view; 0 lost, 0 duplicated, no half
transaction seen. ``make campaign-failover`` runs the long campaign of the same trials."""

import pytest

from tidemark_workshop import failover

pytestmark = pytest.mark.stack


def test_one_trial_of_each_failover_loses_nothing_and_applies_nothing_twice(settings, tmp_path):
    with failover.replicated_site(settings, tmp_path / "site") as (site, cluster):
        campaign = failover.run(site, cluster, tmp_path, len(failover.KINDS), seed=20261207)
    trials = campaign.trials
    print(campaign.summary())
    assert [t.kind for t in trials] == list(failover.KINDS)
    assert all(t.node for t in trials), "every trial broke something"
    assert [t.problems for t in trials] == [[]] * len(trials)
    assert sum(t.lost for t in trials) == 0 and sum(t.duplicated for t in trials) == 0
    assert all(t.recover_s is not None for t in trials)
    assert all(t.rows == failover.ACCOUNTS and t.settled and t.events and t.reads for t in trials), \
        "a trial compared nothing"
    assert campaign.summary()["ok"]
