package tidemark.connect;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;
import org.junit.jupiter.api.Test;

/**
 * The converter signs what JsonConverter writes: the header tidemark.signature = "key id:hex HMAC-SHA256 of
 * topic, NUL, value", as tidemark.realtime.cdc.signing verifies it.
 */
class SigningJsonConverterTest {
    // record_key(b"a" * 40) of tidemark.realtime.cdc.signing: the derived key a worker is given
    private static final String SECRET = "fb85661e496ff440b6a4e8c2a13fdbb3a73225f0a8d31aa87fe3683fcd50e10b";
    private static final String TOPIC = "tidemark.cdc.payments.public.payments";
    private static final Schema ROW = SchemaBuilder.struct().name("payments.Value")
        .field("id", Schema.INT64_SCHEMA).field("currency", Schema.OPTIONAL_STRING_SCHEMA).build();

    private static SigningJsonConverter converter(String keyId, String secret, String schemas) {
        Map<String, Object> config = new HashMap<>();
        config.put("signing.key.id", keyId);
        config.put("signing.secret", secret);
        config.put("schemas.enable", schemas);
        SigningJsonConverter converter = new SigningJsonConverter();
        converter.configure(config, false);
        return converter;
    }

    private static byte[] hmac(String secret, String topic, byte[] value) throws Exception {
        Mac mac = Mac.getInstance("HmacSHA256");
        mac.init(new SecretKeySpec(secret.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
        mac.update(topic.getBytes(StandardCharsets.UTF_8));
        mac.update((byte) 0);
        return mac.doFinal(value);
    }

    /** What a sink holding {@code secret} concludes of a record: its signature holds under key id k1. */
    private static boolean verifies(String secret, String topic, byte[] value, byte[] header) throws Exception {
        String text = new String(header, StandardCharsets.US_ASCII);
        return text.startsWith("k1:") && MessageDigest.isEqual(
            HexFormat.of().formatHex(hmac(secret, topic, value)).getBytes(StandardCharsets.US_ASCII),
            text.substring(3).getBytes(StandardCharsets.US_ASCII));
    }

    @Test
    void aRecordCarriesASignatureThatHoldsUnderItsKeyOnly() throws Exception {
        SigningJsonConverter converter = converter("k1", SECRET, "true");
        Headers headers = new RecordHeaders();  // as the worker hands them over
        Struct row = new Struct(ROW).put("id", 7L).put("currency", "EUR");
        byte[] value = converter.fromConnectData(TOPIC, headers, ROW, row);

        JsonConverter plain = new JsonConverter();
        plain.configure(Map.of("schemas.enable", "true"), false);
        assertArrayEquals(plain.fromConnectData(TOPIC, ROW, row), value, "the value is JsonConverter's, unchanged");

        byte[] signature = headers.lastHeader(SigningJsonConverter.HEADER).value();
        assertEquals(1, headers.toArray().length);
        assertTrue(verifies(SECRET, TOPIC, value, signature));
        assertFalse(verifies("b".repeat(64), TOPIC, value, signature), "another key");
        assertFalse(verifies(SECRET, TOPIC + "x", value, signature), "another topic");
        value[value.length - 2] ^= 1;
        assertFalse(verifies(SECRET, TOPIC, value, signature), "an altered value");
        converter.close();
        plain.close();
    }

    @Test
    void theSignatureIsWhatPythonSignsForTheSameRecord() {
        // tidemark.realtime.cdc.signing.sign(SECRET, TOPIC, b'"hello"'), computed in Python
        SigningJsonConverter converter = converter("k1", SECRET, "false");
        Headers headers = new RecordHeaders();  // as the worker hands them over
        byte[] value = converter.fromConnectData(TOPIC, headers, Schema.STRING_SCHEMA, "hello");
        assertEquals("\"hello\"", new String(value, StandardCharsets.UTF_8));
        assertEquals("k1:099855a04e9e20af32487662fa638260f3d6cf5ccd6f0b08486a9ba612945235",
                     new String(headers.lastHeader(SigningJsonConverter.HEADER).value(), StandardCharsets.US_ASCII));
    }

    @Test
    void aSignatureAlreadyThereIsReplacedNotKept() throws Exception {
        SigningJsonConverter converter = converter("k1", SECRET, "false");
        Headers headers = new RecordHeaders();  // as the worker hands them over
        headers.add(SigningJsonConverter.HEADER, "k1:forged".getBytes(StandardCharsets.US_ASCII));
        byte[] value = converter.fromConnectData(TOPIC, headers, Schema.STRING_SCHEMA, "x");
        assertEquals(1, headers.toArray().length);
        assertTrue(verifies(SECRET, TOPIC, value, headers.lastHeader(SigningJsonConverter.HEADER).value()));
    }

    @Test
    void aTombstoneIsNotSignedAndTheHeaderlessFormIsRefused() {
        SigningJsonConverter converter = converter("k1", SECRET, "false");
        Headers headers = new RecordHeaders();  // as the worker hands them over
        assertNull(converter.fromConnectData(TOPIC, headers, null, null));
        assertEquals(0, headers.toArray().length);
        assertThrows(UnsupportedOperationException.class, () -> converter.fromConnectData(TOPIC, Schema.STRING_SCHEMA, "x"));
    }

    @Test
    void itReadsAsJsonConverterReads() {
        SigningJsonConverter converter = converter("k1", SECRET, "false");
        byte[] value = converter.fromConnectData(TOPIC, new RecordHeaders(), Schema.STRING_SCHEMA, "hello");
        assertEquals("hello", converter.toConnectData(TOPIC, value).value());
        assertEquals("hello", converter.toConnectData(TOPIC, new RecordHeaders(), value).value());
    }

    @Test
    void aConfigErrorNamesTheSetting() {
        Object[][] bad = {
            {null, SECRET, "signing.key.id"}, {"k 1", SECRET, "signing.key.id"}, {"k".repeat(65), SECRET, "signing.key.id"},
            {"k1", null, "signing.secret"}, {"k1", "s".repeat(31), "signing.secret: at least 32 characters"},
        };
        for (Object[] b : bad) {
            ConfigException refused = assertThrows(ConfigException.class,
                () -> converter((String) b[0], (String) b[1], "false"));
            assertTrue(refused.getMessage().contains((String) b[2]), refused.getMessage());
            assertFalse(refused.getMessage().contains(SECRET), "the secret is never in an error");
        }
        converter("k1", "s".repeat(32), "false").close();  // 32 characters are enough
    }
}
