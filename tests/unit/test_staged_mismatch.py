"""The refusal of a batch whose stage differs from the extract's sealed totals names each
partition's cause and one next step that fits them (not "check the extract log" for all)."""

from tidemark.protocol.totals import staged_mismatch


def test_equal_totals_are_no_mismatch():
    assert not staged_mismatch({0: (3, 30), 1: (0, 0)}, {0: (3, 30)})


def test_each_partition_gets_its_cause():
    found = staged_mismatch({0: (3, 30), 1: (2, 20), 2: (4, 40)}, {0: (4, 31), 1: (1, 10), 2: (4, 41)})
    assert found.findings == [
        "partition 0: 1 record(s) more than the extract wrote, a record sent twice or by another producer "
        "(extract rows=3 checksum=30, staged rows=4 checksum=31)",
        "partition 1: 1 record(s) the extract wrote never reached the stage (extract rows=2 checksum=20, "
        "staged rows=1 checksum=10)",
        "partition 2: as many records as the extract wrote, other content (extract rows=4 checksum=40, "
        "staged rows=4 checksum=41)",
    ]
    assert found.next_step.index("extra records") < found.next_step.index("replaced") < found.next_step.index("retention")


def test_a_partition_staged_but_never_written_counts_as_more():
    found = staged_mismatch({0: (0, 0)}, {0: (0, 0), 1: (1, 7)})
    assert found.findings == ["partition 1: 1 record(s) more than the extract wrote, a record sent twice or by "
                              "another producer (extract rows=0 checksum=0, staged rows=1 checksum=7)"]
    assert "{topic}" in found.next_step and "revoke" in found.next_step
