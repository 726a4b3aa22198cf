package tidemark.connect;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.regex.Pattern;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.storage.Converter;

/**
 * Kafka Connect's JsonConverter, and a signature of what it wrote: each record leaves the worker
 * with the header {@code tidemark.signature} = {@code <key id>:<hex HMAC-SHA256 of topic, NUL,
 * value bytes>}. Tidemark's sink applies a change record only when the signature holds under a key
 * of its own keyring (tidemark.realtime.cdc.signing), so a record someone else produced to a CDC topic is a
 * dead letter, never a change in the warehouse. The topic is signed with the value: a genuine
 * record copied to another pipeline's topic does not verify there.
 *
 * Settings (as value.converter.*): {@code signing.key.id} and {@code signing.secret}, the latter a
 * config provider reference so that the key never sits in Connect's config topic (its name ends in
 * "secret", so Debezium masks it where it logs a task's configuration). Every other setting is
 * JsonConverter's.
 */
public final class SigningJsonConverter implements Converter {
    public static final String HEADER = "tidemark.signature";
    private static final Pattern KEY_ID = Pattern.compile("[A-Za-z0-9._-]{1,64}");
    private static final int MIN_KEY_CHARS = 32;

    private final JsonConverter json = new JsonConverter();
    private Mac mac;
    private byte[] keyId;

    @Override
    public void configure(Map<String, ?> configs, boolean isKey) {
        Map<String, Object> rest = new HashMap<>(configs);
        Object id = rest.remove("signing.key.id");
        Object key = rest.remove("signing.secret");
        if (!(id instanceof String) || !KEY_ID.matcher((String) id).matches()) {
            throw new ConfigException("signing.key.id", id, "1-64 of A-Z a-z 0-9 . _ -");
        }
        if (!(key instanceof String) || ((String) key).length() < MIN_KEY_CHARS) {
            throw new ConfigException("signing.secret: at least " + MIN_KEY_CHARS + " characters are needed");
        }
        try {
            mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(((String) key).getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
        } catch (GeneralSecurityException e) {
            throw new ConfigException("HmacSHA256 unavailable: " + e);
        }
        keyId = ((String) id + ":").getBytes(StandardCharsets.US_ASCII);
        json.configure(rest, isKey);
    }

    @Override
    public byte[] fromConnectData(String topic, Schema schema, Object value) {
        // the worker calls the form with headers; without them there is nowhere to put a signature
        throw new UnsupportedOperationException("SigningJsonConverter signs into the record's headers");
    }

    @Override
    public byte[] fromConnectData(String topic, Headers headers, Schema schema, Object value) {
        byte[] bytes = json.fromConnectData(topic, headers, schema, value);
        if (bytes == null) {
            return null;  // a tombstone: nothing to sign, and the sink applies none
        }
        byte[] signature;
        synchronized (mac) {
            mac.update(topic.getBytes(StandardCharsets.UTF_8));
            mac.update((byte) 0);
            signature = mac.doFinal(bytes);
        }
        byte[] hex = HexFormat.of().formatHex(signature).getBytes(StandardCharsets.US_ASCII);
        byte[] header = new byte[keyId.length + hex.length];
        System.arraycopy(keyId, 0, header, 0, keyId.length);
        System.arraycopy(hex, 0, header, keyId.length, hex.length);
        headers.remove(HEADER);
        headers.add(HEADER, header);
        return bytes;
    }

    @Override
    public void close() {
        json.close();
    }

    @Override
    public SchemaAndValue toConnectData(String topic, byte[] value) {
        return json.toConnectData(topic, value);
    }

    @Override
    public SchemaAndValue toConnectData(String topic, Headers headers, byte[] value) {
        return json.toConnectData(topic, headers, value);
    }
}
