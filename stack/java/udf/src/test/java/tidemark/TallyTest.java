package tidemark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.math.BigInteger;
import java.util.Map;
import java.util.Random;
import java.util.Set;

import org.junit.jupiter.api.Test;

/** tally()'s accumulator: per partition rows, the exact sum of the row hashes in two halves, the cursor's range. */
class TallyTest {
    private static final long NONE_MIN = Long.MAX_VALUE, NONE_MAX = Long.MIN_VALUE;

    /** The exact sum of the hashes, as tidemark.protocol.totals.from_tally reads it: high * 2^32 + low. */
    private static BigInteger sum(long[] t) {
        return BigInteger.valueOf(t[1]).shiftLeft(32).add(BigInteger.valueOf(t[2]));
    }

    @Test
    void addCountsRowsSumsHashesExactlyAndKeepsTheCursorsRange() {
        Tally.Totals totals = new Tally.Totals();
        assertTrue(totals.isZero());
        Random random = new Random(7);
        BigInteger expected = BigInteger.ZERO;
        for (int i = 0; i < 10_000; i++) {
            long hash = random.nextLong();
            expected = expected.add(BigInteger.valueOf(hash));
            totals.add(3, hash, (long) (i % 500) - 100);
        }
        totals.add(3, Long.MIN_VALUE, null);  // a record without a cursor counts, and leaves the range alone
        totals.add(3, Long.MAX_VALUE, null);
        expected = expected.add(BigInteger.valueOf(Long.MIN_VALUE)).add(BigInteger.valueOf(Long.MAX_VALUE));
        long[] t = totals.value().get(3);
        assertFalse(totals.isZero());
        assertEquals(10_002, t[0]);
        assertEquals(expected, sum(t));
        assertEquals(-100, t[3]);
        assertEquals(399, t[4]);
        assertEquals(Set.of(3), totals.value().keySet());
    }

    @Test
    void aPartitionWithoutCursorsKeepsTheEmptyRange() {
        Tally.Totals totals = new Tally.Totals();
        totals.add(0, -1, null);
        assertArrayEquals(new long[] {1, -1, 0xFFFFFFFFL, NONE_MIN, NONE_MAX}, totals.value().get(0));
        assertEquals("0 1 -1 4294967295 " + NONE_MIN + " " + NONE_MAX + "\n", totals.text());
    }

    @Test
    void mergeAddsPerPartitionAndWidensTheRange() {
        Tally.Totals a = new Tally.Totals(), b = new Tally.Totals();
        a.add(0, 10, 5L);
        a.add(1, -20, 7L);
        b.add(1, 30, 2L);
        b.add(1, 1L << 40, 9L);
        b.add(2, 4, null);
        a.merge(b);
        Map<Integer, long[]> v = a.value();
        assertEquals(Set.of(0, 1, 2), v.keySet());
        assertArrayEquals(new long[] {1, 0, 10, 5, 5}, v.get(0));
        assertEquals(3, v.get(1)[0]);
        assertEquals(BigInteger.valueOf(-20 + 30 + (1L << 40)), sum(v.get(1)));
        assertEquals(2, v.get(1)[3]);
        assertEquals(9, v.get(1)[4]);
        assertArrayEquals(new long[] {1, 0, 4, NONE_MIN, NONE_MAX}, v.get(2));
        assertEquals(2, b.value().size(), "merge leaves the other accumulator as it was");
    }

    @Test
    void mergeIntoAnEmptyOneAndCopyEqualTheOriginalAndStayApart() {
        Tally.Totals original = new Tally.Totals();
        original.add(5, 123_456_789_012L, 40L);
        original.add(6, -9, 41L);
        Tally.Totals copy = original.copy();
        assertNotSame(original, copy);
        assertEquals(original.text(), copy.text());
        copy.add(5, 1, 1L);
        assertEquals(1, original.value().get(5)[0], "adding to the copy leaves the original alone");
        assertEquals(2, copy.value().get(5)[0]);
        Tally.Totals empty = new Tally.Totals();
        empty.merge(original);
        assertEquals(original.text(), empty.text());
    }

    @Test
    void resetEmptiesIt() {
        Tally.Totals totals = new Tally.Totals();
        totals.add(0, 1, 1L);
        totals.reset();
        assertTrue(totals.isZero());
        assertEquals("", totals.text());
        assertTrue(totals.copy().isZero());
    }

    @Test
    void recordsAreAddedThroughTheUdfOnly() {
        assertThrows(UnsupportedOperationException.class, () -> new Tally.Totals().add(new long[] {1}));
    }
}
