package tidemark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.nio.charset.StandardCharsets;

import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.utils.Utils;
import org.junit.jupiter.api.Test;

/** kafka_partition(key, partitions) is the partition Kafka's own producer picks for the key. */
class KafkaPartitionTest {
    private static final String[] KEYS = {
        "", "0", "21", "foobar", "42", "order-1", "order-2", "a-little-bit-longer-string",
        "d4f1c2a8-1b3e-4c5d-9e7f-0a1b2c3d4e5f", "\u00fc\u00f1\u00ee\u00e7\u00f8d\u00e9", "\u20ac\ud83c\udf0a",
        "x".repeat(1000),
    };

    @Test
    void thePartitionIsTheDefaultPartitionersForEveryKeyAndCount() {
        KafkaPartition udf = new KafkaPartition();
        for (String key : KEYS) {
            byte[] bytes = key.getBytes(StandardCharsets.UTF_8);
            for (int partitions : new int[] {1, 2, 3, 7, 12, 100, 1000}) {
                // the producer's own code path for a keyed record without a partitioner of its own
                assertEquals(BuiltInPartitioner.partitionForKey(bytes, partitions), udf.call(key, partitions),
                             key + " over " + partitions);
                assertEquals(Utils.toPositive(Utils.murmur2(bytes)) % partitions, udf.call(key, partitions));
            }
        }
    }

    @Test
    void knownPartitionsStayPut() {
        // murmur2("21") = -973932308, murmur2("foobar") = -790332482 (Kafka's own murmur2 test values)
        KafkaPartition udf = new KafkaPartition();
        assertEquals((-973932308 & 0x7fffffff) % 12, udf.call("21", 12));
        assertEquals((-790332482 & 0x7fffffff) % 7, udf.call("foobar", 7));
    }

    @Test
    void aNullKeyOrCountIsNull() {
        KafkaPartition udf = new KafkaPartition();
        assertNull(udf.call(null, 3));
        assertNull(udf.call("k", null));
    }
}
