package tidemark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Random;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;

/** DirectCopy's encoding beyond the shared vectors: random numerics of every width, whole rows, the type checks. */
class DirectCopyTest {
    private static byte[] numeric(BigDecimal value, int scale) throws IOException {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        DirectCopy.numeric(new DataOutputStream(bytes), value, scale);
        return bytes.toByteArray();
    }

    /** A numeric field read back as PostgreSQL's numeric_recv reads it, insisting on the stored (stripped) form. */
    private static BigDecimal decode(byte[] field) {
        ByteBuffer in = ByteBuffer.wrap(field);
        int length = in.getInt(), ndigits = in.getShort(), weight = in.getShort(), sign = in.getShort() & 0xffff;
        int dscale = in.getShort();
        assertEquals(8 + 2 * ndigits, length);
        assertTrue(sign == 0 || sign == 0x4000, "sign " + sign);
        BigDecimal value = BigDecimal.ZERO;
        for (int i = 0; i < ndigits; i++) {
            int digit = in.getShort();
            assertTrue(digit >= 0 && digit < 10_000, "digit " + digit);
            if (i == 0 || i == ndigits - 1) {
                assertNotEquals(0, digit, "a leading or trailing zero digit: PostgreSQL stores none");
            }
            value = value.add(BigDecimal.valueOf(digit).scaleByPowerOfTen(4 * (weight - i)));
        }
        if (ndigits == 0) {
            assertEquals(0, weight);
        }
        assertEquals(0, in.remaining());
        return (sign == 0x4000 ? value.negate() : value).setScale(dscale);
    }

    @Test
    void randomNumericsOfEveryPrecisionAndScaleDecodeToThemselves() throws IOException {
        Random random = new Random(54);
        for (int precision = 1; precision <= 38; precision++) {
            for (int scale = 0; scale <= precision; scale++) {
                for (int k = 0; k < 20; k++) {
                    int digits = random.nextInt(precision + 1);
                    BigInteger unscaled = digits == 0 ? BigInteger.ZERO
                        : new BigInteger(digits * 4, random).mod(BigInteger.TEN.pow(digits));
                    BigDecimal value = new BigDecimal(random.nextBoolean() ? unscaled : unscaled.negate(), scale);
                    assertEquals(value, decode(numeric(value, scale)), value + " numeric(" + precision + "," + scale + ")");
                }
                BigDecimal widest = new BigDecimal(BigInteger.TEN.pow(precision).subtract(BigInteger.ONE), scale);
                assertEquals(widest.negate(), decode(numeric(widest.negate(), scale)));
            }
        }
    }

    @Test
    void theLongAndTheTextPathAgreeWhereTheyMeet() throws IOException {
        // unscaled values of 62 bits take the long path, of 63 the text path: both must write PostgreSQL's form
        for (long unscaled : new long[] {(1L << 62) - 1, 1L << 62, Long.MAX_VALUE, -(1L << 62), Long.MIN_VALUE + 1}) {
            for (int scale : new int[] {0, 4, 14, 15}) {
                BigDecimal value = BigDecimal.valueOf(unscaled, scale);
                assertEquals(value, decode(numeric(value, scale)));
            }
        }
        BigDecimal minimum = new BigDecimal(BigInteger.valueOf(Long.MIN_VALUE), 2);
        assertEquals(minimum, decode(numeric(minimum, 2)));
    }

    @Test
    void aValueIsWrittenAtItsColumnsScale() throws IOException {
        // Spark hands the decimal at the column's scale; 1.5 in numeric(6,3) is 1.500, dscale 3
        assertEquals("0000000c000200000000000300011388", HexFormat.of().formatHex(numeric(new BigDecimal("1.5"), 3)));
    }

    @Test
    void aRowIsItsFieldsInOrderWithNullsAsMinusOne() throws Exception {
        StructType schema = new StructType().add("id", DataTypes.LongType).add("name", DataTypes.StringType)
            .add("small", DataTypes.IntegerType);
        DirectCopy.Encoder encoder = new DirectCopy.Encoder(schema, new String[] {"bigint", "text", "smallint"}, 3);
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        encoder.write(new DataOutputStream(bytes), new GenericInternalRow(new Object[] {7L, null, -2}));
        assertEquals("000000080000000000000007" + "ffffffff" + "00000002fffe", HexFormat.of().formatHex(bytes.toByteArray()));
        assertEquals(3, encoder.fields);
    }

    @Test
    void aSmallintOutOfRangeIsRefusedNamingTheValueAndNothingOfTheFieldIsWritten() {
        DirectCopy.Encoder encoder = new DirectCopy.Encoder(new StructType().add("s", DataTypes.IntegerType),
                                                            new String[] {"smallint"}, 1);
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        DirectCopy.Unencodable refused = assertThrows(DirectCopy.Unencodable.class, () ->
            encoder.write(new DataOutputStream(bytes), new GenericInternalRow(new Object[] {40_000})));
        assertEquals("column of type smallint: value 40000 out of range [-32768, 32767]", refused.getMessage());
        assertEquals(0, bytes.size());
    }

    @Test
    void aUuidIsItsSixteenBytesFromTheCanonicalTextOnly() throws Exception {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        DirectCopy.uuid(new DataOutputStream(bytes), "00000000-0000-0000-0000-0000000000ff".getBytes(StandardCharsets.US_ASCII));
        assertArrayEquals(HexFormat.of().parseHex("00000010" + "00".repeat(15) + "ff"), bytes.toByteArray());
        for (String form : new String[] {"", "00000000-0000-0000-0000-0000000000f", "00000000-0000-0000-0000-0000000000fff",
                                         "0000000000000-0000-0000-0000000000ff", "00000000-0000-0000-0000-0000000000f\u00e9"}) {
            assertThrows(DirectCopy.Unencodable.class, () ->
                DirectCopy.uuid(new DataOutputStream(new ByteArrayOutputStream()), form.getBytes(StandardCharsets.UTF_8)), form);
        }
    }

    @Test
    void aSparkTypeThatDoesNotHoldTheColumnExactlyIsRefusedBeforeAnyTaskRuns() {
        Object[][] mismatches = {
            {DataTypes.LongType, "smallint"}, {DataTypes.IntegerType, "bigint"}, {DataTypes.DoubleType, "real"},
            {DataTypes.FloatType, "double precision"}, {DataTypes.StringType, "integer"},
            {DataTypes.createDecimalType(10, 2), "numeric(10,3)"}, {DataTypes.LongType, "timestamp with time zone"},
            {DataTypes.StringType, "bytea"}, {DataTypes.IntegerType, "text"},
        };
        for (Object[] m : mismatches) {
            IllegalArgumentException refused = assertThrows(IllegalArgumentException.class,
                () -> DirectCopy.kind((org.apache.spark.sql.types.DataType) m[0], (String) m[1]));
            assertTrue(refused.getMessage().contains("no exact binary COPY form"), refused.getMessage());
        }
        assertEquals(DirectCopy.Kind.NUMERIC, DirectCopy.kind(DataTypes.createDecimalType(10, 2), "numeric(12,2)"));
        assertEquals(DirectCopy.Kind.TEXT, DirectCopy.kind(DataTypes.StringType, "character varying(5)"));
        assertEquals(DirectCopy.Kind.TEXT, DirectCopy.kind(DataTypes.StringType, "character(3)"));
        assertEquals(DirectCopy.Kind.UUID, DirectCopy.kind(DataTypes.StringType, "uuid"));
    }

    @Test
    void textAndJsonbAreTheirUtf8BytesJsonbAfterItsVersionByte() throws Exception {
        assertEquals("00000003e282ac", HexFormat.of().formatHex(DirectCopyVectorsTest.encode("text", "\u20ac")));
        assertEquals("00000003015b5d", HexFormat.of().formatHex(DirectCopyVectorsTest.encode("jsonb", "[]")));
        assertEquals("00000000", HexFormat.of().formatHex(DirectCopyVectorsTest.encode("character varying(4)", "")));
    }
}
