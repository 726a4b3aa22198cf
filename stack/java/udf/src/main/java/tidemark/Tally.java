package tidemark;

import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF3;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.util.AccumulatorV2;

/**
 * tally(partition, row_hash, cursor): returns the partition and, on the way, adds the record to
 * the END totals of that partition (rows, the exact sum of 64-bit row hashes, the smallest and
 * largest cursor as a long). The extract sends each record to the partition this returns, so the
 * totals describe exactly the records written, counted in the JVM without a Python round trip.
 * Exact when each task's update counts once: the extract runs with spark.task.maxFailures=1 and
 * tallies in its result stage, as tidemark.protocol.totals.TotalsParam did.
 */
public final class Tally implements UDF3<Integer, Long, Long, Integer> {
    private static final long serialVersionUID = 1L;

    private final Totals totals;

    private Tally(Totals totals) {
        this.totals = totals;
    }

    /** Registers the function under {@code name} and returns the accumulator it adds to. */
    public static Totals register(SparkSession spark, String name) {
        Totals totals = new Totals();
        spark.sparkContext().register(totals, name);
        UserDefinedFunction udf = functions.udf(new Tally(totals), DataTypes.IntegerType).asNondeterministic();
        spark.udf().register(name, udf);
        return totals;
    }

    @Override
    public Integer call(Integer partition, Long rowHash, Long cursor) {
        if (partition == null || rowHash == null) {
            throw new IllegalArgumentException("tally: a record without partition or row hash");
        }
        totals.add(partition, rowHash, cursor);
        return partition;
    }

    /** Per partition: rows, sum of the hashes' high 32 bits, sum of their low 32 bits, cursor min, max. */
    public static final class Totals extends AccumulatorV2<long[], Map<Integer, long[]>> {
        private static final long serialVersionUID = 1L;

        private final HashMap<Integer, long[]> byPartition = new HashMap<>();

        void add(int partition, long rowHash, Long cursor) {
            long[] t = byPartition.computeIfAbsent(partition, p -> new long[] {0, 0, 0, Long.MAX_VALUE, Long.MIN_VALUE});
            t[0] += 1;
            t[1] += rowHash >> 32;
            t[2] += rowHash & 0xFFFFFFFFL;
            if (cursor != null) {
                t[3] = Math.min(t[3], cursor);
                t[4] = Math.max(t[4], cursor);
            }
        }

        @Override
        public boolean isZero() {
            return byPartition.isEmpty();
        }

        @Override
        public Totals copy() {
            Totals c = new Totals();
            c.merge(this);
            return c;
        }

        @Override
        public void reset() {
            byPartition.clear();
        }

        @Override
        public void add(long[] v) {
            throw new UnsupportedOperationException("tally adds records through add(partition, hash, cursor)");
        }

        @Override
        public void merge(AccumulatorV2<long[], Map<Integer, long[]>> other) {
            for (Map.Entry<Integer, long[]> e : other.value().entrySet()) {
                long[] o = e.getValue();
                long[] t = byPartition.computeIfAbsent(e.getKey(), p -> new long[] {0, 0, 0, Long.MAX_VALUE, Long.MIN_VALUE});
                t[0] += o[0];
                t[1] += o[1];
                t[2] += o[2];
                t[3] = Math.min(t[3], o[3]);
                t[4] = Math.max(t[4], o[4]);
            }
        }

        @Override
        public Map<Integer, long[]> value() {
            return byPartition;
        }

        /** "partition rows high low min max" per line: read by tidemark.protocol.totals.from_tally. */
        public String text() {
            StringBuilder out = new StringBuilder();
            for (Map.Entry<Integer, long[]> e : byPartition.entrySet()) {
                long[] t = e.getValue();
                out.append(e.getKey()).append(' ').append(t[0]).append(' ').append(t[1]).append(' ').append(t[2])
                   .append(' ').append(t[3]).append(' ').append(t[4]).append('\n');
            }
            return out.toString();
        }
    }
}
