package tidemark;

import java.nio.charset.StandardCharsets;

import org.apache.kafka.common.utils.Utils;
import org.apache.spark.sql.api.java.UDF2;

/**
 * kafka_partition(key, partitions): the partition Kafka's default partitioner (murmur2) picks
 * for a string key, which librdkafka's murmur2_random also picks. The extract job writes each
 * record to this partition explicitly and counts per partition in the same pass, so the counts
 * in END are the counts the sink sees.
 */
public final class KafkaPartition implements UDF2<String, Integer, Integer> {
    private static final long serialVersionUID = 1L;

    @Override
    public Integer call(String key, Integer partitions) {
        if (key == null || partitions == null) {
            return null;
        }
        return Utils.toPositive(Utils.murmur2(key.getBytes(StandardCharsets.UTF_8))) % partitions;
    }
}
