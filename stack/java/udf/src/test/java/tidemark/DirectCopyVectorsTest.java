package tidemark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * DirectCopy's encoder against the vectors it shares with tidemark.protocol.pgbinary (tests/vectors/pgbinary.tsv):
 * PostgreSQL's own bytes for each value (its type's send function), or the refusal a value must meet.
 * Each value goes through the Encoder as a task's row does: a Spark InternalRow of the type the record's
 * Avro schema decodes to.
 */
class DirectCopyVectorsTest {
    static final Path VECTORS = Path.of(System.getProperty("tidemark.repo", "../../.."), "tests", "vectors", "pgbinary.tsv");
    private static final Pattern NUMERIC = Pattern.compile("numeric\\((\\d+),(\\d+)\\)");

    static Stream<Arguments> vectors() throws IOException {
        List<String> lines = Files.readAllLines(VECTORS, StandardCharsets.UTF_8);
        return lines.stream().filter(l -> !l.isEmpty() && !l.startsWith("#")).map(l -> {
            String[] f = l.split("\t");
            return Arguments.of(f[0], f[1], f[2]);
        });
    }

    @ParameterizedTest(name = "{0} {1}")
    @MethodSource("vectors")
    void encodesAsPostgresqlSendsOrRefuses(String sqlType, String value, String expected) throws Exception {
        if (expected.startsWith("refused: ")) {
            DirectCopy.Unencodable refused = assertThrows(DirectCopy.Unencodable.class, () -> encode(sqlType, value));
            assertTrue(refused.getMessage().contains(expected.substring("refused: ".length())), refused.getMessage());
            assertTrue(refused.getMessage().startsWith("column of type " + sqlType), refused.getMessage());
        } else {
            assertEquals(expected, HexFormat.of().formatHex(encode(sqlType, value)));
        }
    }

    @Test
    void theVectorsAreThere() throws IOException {
        assertTrue(vectors().count() >= 40, "tests/vectors/pgbinary.tsv lost its vectors");
    }

    /** How the task's row holds a column of a SQL type: its Spark type, and a value of it from the vector's text. */
    private record Held(DataType type, Function<String, Object> internal) {
    }

    private static final Map<String, Held> HELD = Map.of(
        "smallint", new Held(DataTypes.IntegerType, Integer::valueOf),
        "integer", new Held(DataTypes.IntegerType, Integer::valueOf),
        "bigint", new Held(DataTypes.LongType, Long::valueOf),
        "boolean", new Held(DataTypes.BooleanType, Boolean::valueOf),
        "real", new Held(DataTypes.FloatType, Float::valueOf),
        "double precision", new Held(DataTypes.DoubleType, Double::valueOf),
        "date", new Held(DataTypes.DateType, Integer::valueOf),  // days since 1970-01-01
        "timestamp with time zone", new Held(DataTypes.TimestampType, Long::valueOf));  // microseconds since 1970 UTC

    /** One field: the value as the task's row holds it, written by an Encoder of one column. */
    static byte[] encode(String sqlType, String value) throws IOException, DirectCopy.Unencodable {
        Matcher numeric = NUMERIC.matcher(sqlType);
        Held held = HELD.getOrDefault(sqlType, new Held(DataTypes.StringType, UTF8String::fromString));
        if (numeric.matches()) {
            int precision = Integer.parseInt(numeric.group(1)), scale = Integer.parseInt(numeric.group(2));
            held = new Held(DataTypes.createDecimalType(precision, scale),
                            text -> Decimal.apply(new BigDecimal(text), precision, scale));
        }
        DataType type = held.type();
        Object internal = value.equals("\\N") ? null : held.internal().apply(value);
        DirectCopy.Encoder encoder = new DirectCopy.Encoder(new StructType().add("c0", type), new String[] {sqlType}, 1);
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        encoder.write(new DataOutputStream(bytes), new GenericInternalRow(new Object[] {internal}));
        return bytes.toByteArray();
    }
}
