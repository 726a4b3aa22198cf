package tidemark;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.StructType;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyIn;

/**
 * A direct extract's tasks (transport: direct): each task COPYs its decoded rows into the attempt's
 * typed stage in PostgreSQL's binary format, straight from Spark's rows, in loads of at most
 * {@code loadRows} rows (and 16 MB), each under a new load id: read and encoded first, then COPYed in
 * a transaction of its own while the ledger shows the attempt open (its row held FOR SHARE: a
 * superseded or aborted attempt stages nothing more), on a thread of the task's own while the task
 * reads and encodes the next load. It returns one line per load and partition:
 * "load partition rows checksum".
 *
 * The rows' columns: the record's fields in the stage's order, then partition (int) and row_hash
 * (long). Every value goes in its column's own binary form, so the server checks what it checks in
 * text (a numeric's precision, UTF-8 and NUL in text, a char(n)'s length); what cannot be written
 * exactly (a smallint out of range, a uuid not in canonical form) is refused here, as
 * tidemark.protocol.pgbinary refuses it. A refusal of the rows themselves, here or by the server, fails the task
 * with a {@link StageRefused}. Replaces the hand-over of every row to a Python worker (Arrow),
 * which cost more CPU than the read and the COPY together.
 */
public final class DirectCopy {
    /** The words a refusal starts with (StageRefused's message), which the extract's failure line quotes. */
    static final String REFUSED = "the typed stage refused";
    private static final long EPOCH_2000_DAYS = 10_957;
    private static final long EPOCH_2000_US = EPOCH_2000_DAYS * 86_400L * 1_000_000L;
    private static final long MIN_DATE_DAYS = -2_451_545, MAX_DATE_DAYS = 2_145_031_948;
    private static final long MIN_TIMESTAMP_US = -211_813_488_000_000_000L;
    private static final Pattern NUMERIC = Pattern.compile("^numeric\\((\\d+),(\\d+)\\)$");
    private static final Pattern TEXT = Pattern.compile(
        "^(text|json|character varying(\\(\\d+\\))?|character(\\(\\d+\\))?)$");
    // A load's bytes are held in memory until its COPY, two loads a task: a load ends past this many, whatever
    // loadRows says, so its buffer (doubling from 2 MB) stays at 16 MB unless one row is larger than 1 MB.
    private static final int LOAD_BYTES = 15 << 20;
    private static final byte[] HEADER = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', (byte) 0xff, '\r', '\n', 0, 0, 0, 0, 0, 0, 0, 0, 0};

    private DirectCopy() {
    }

    /**
     * Runs the job: stages every row of {@code rows} and returns the loads. {@code columns} and
     * {@code types}: the stage's quoted column names and PostgreSQL types (format_type), one per
     * line, the record's fields first, then the load's and the provenance's.
     */
    public static List<String> stage(Dataset<Row> rows, String url, String user, String password, String batchId,
                                     int attempt, String stage, String columns, String types, int loadRows) {
        StructType schema = rows.schema();
        String[] names = columns.split("\n"), sqlTypes = types.split("\n");
        int fields = schema.fields().length - 2;
        if (fields < 0 || !schema.fields()[fields].dataType().equals(DataTypes.IntegerType)
            || !schema.fields()[fields + 1].dataType().equals(DataTypes.LongType) || loadRows < 1) {
            throw new IllegalArgumentException("DirectCopy: the rows end with partition (int) and row_hash (long), and a "
                                               + "load holds at least one row; got " + schema.simpleString()
                                               + " and loads of " + loadRows);
        }
        if (names.length != fields + 4 || sqlTypes.length != fields + 4
            || !List.of(sqlTypes).subList(fields, fields + 4).equals(List.of("bigint", "integer", "bigint", "bigint"))) {
            throw new IllegalArgumentException("DirectCopy: " + fields + " fields need " + (fields + 4) + " columns and "
                                               + "types, the last four the load's and the provenance's; got " + names.length
                                               + " and " + List.of(sqlTypes));
        }
        Encoder encoder = new Encoder(schema, sqlTypes, fields);
        String copy = "COPY " + stage + " (" + String.join(", ", names) + ") FROM STDIN WITH (FORMAT binary)";
        Task task = new Task(url, user, password, batchId, attempt, copy, encoder, loadRows);
        return rows.queryExecution().toRdd().toJavaRDD().mapPartitions(task).collect();
    }

    /**
     * The whole binary COPY stream of {@code rows} (every column a field, {@code types} one per line),
     * as the tasks encode their fields: for tests against the server, on small data.
     */
    public static byte[] copyStream(Dataset<Row> rows, String types) throws IOException {
        StructType schema = rows.schema();
        Encoder encoder = new Encoder(schema, types.split("\n"), schema.fields().length);
        List<byte[]> parts = rows.queryExecution().toRdd().toJavaRDD().mapPartitions(
            (FlatMapFunction<Iterator<InternalRow>, byte[]>) it -> {
                Buffer buffer = new Buffer();
                DataOutputStream out = new DataOutputStream(buffer);
                while (it.hasNext()) {
                    out.writeShort(encoder.fields);
                    encoder.write(out, it.next());
                }
                return List.of(buffer.toByteArray()).iterator();
            }).collect();
        ByteArrayOutputStream all = new ByteArrayOutputStream();
        all.write(HEADER);
        for (byte[] part : parts) {
            all.write(part);
        }
        all.write(new byte[] {(byte) 0xff, (byte) 0xff});
        return all.toByteArray();
    }

    /** How a column is written: its SQL type. The rows come from the record's own Avro schema (tidemark.protocol.avro), so
     *  each SQL type arrives as exactly one Spark type (smallint and integer as int, bigint as long, real as float,
     *  double precision as double);
     *  any other pairing is refused by kind(), not converted. */
    enum Kind { SMALLINT, INTEGER, BIGINT, BOOLEAN, REAL, DOUBLE, DATE, TIMESTAMPTZ, NUMERIC, UUID, JSONB, TEXT }

    /** The column's Kind; refused, before any task runs, where its Spark type is not one this writer sends as its SQL type. */
    static Kind kind(DataType t, String sqlType) {
        boolean isInt = t.equals(DataTypes.IntegerType), isLong = t.equals(DataTypes.LongType);
        Matcher numeric = NUMERIC.matcher(sqlType);
        Kind kind = switch (sqlType) {
            case "smallint" -> isInt ? Kind.SMALLINT : null;
            case "integer" -> isInt ? Kind.INTEGER : null;
            case "bigint" -> isLong ? Kind.BIGINT : null;
            case "boolean" -> t.equals(DataTypes.BooleanType) ? Kind.BOOLEAN : null;
            case "real" -> t.equals(DataTypes.FloatType) ? Kind.REAL : null;
            case "double precision" -> t.equals(DataTypes.DoubleType) ? Kind.DOUBLE : null;
            case "date" -> t.equals(DataTypes.DateType) ? Kind.DATE : null;
            case "timestamp with time zone" -> t.equals(DataTypes.TimestampType) ? Kind.TIMESTAMPTZ : null;
            case "uuid" -> t.equals(DataTypes.StringType) ? Kind.UUID : null;
            case "jsonb" -> t.equals(DataTypes.StringType) ? Kind.JSONB : null;
            default -> numeric.matches()
                ? (t instanceof DecimalType d && d.scale() == Integer.parseInt(numeric.group(2)) ? Kind.NUMERIC : null)
                : (t.equals(DataTypes.StringType) && TEXT.matcher(sqlType).matches() ? Kind.TEXT : null);
        };
        if (kind == null) {
            throw new IllegalArgumentException("column of type " + sqlType + ": no exact binary COPY form here from "
                                               + "Spark type " + t.simpleString());
        }
        return kind;
    }

    /** A value its column's binary form cannot carry as PostgreSQL would accept it. */
    static final class Unencodable extends Exception {
        private static final long serialVersionUID = 1L;

        Unencodable(String message) {
            super(message);
        }
    }

    /** A byte buffer whose bytes go to the COPY without a copy of their own. */
    static final class Buffer extends ByteArrayOutputStream {
        Buffer() {
            super(1 << 21);
        }

        void sendTo(CopyIn in) throws SQLException {
            in.writeToCopy(buf, 0, count);
            reset();
        }
    }

    static final class Task implements FlatMapFunction<Iterator<InternalRow>, String> {
        private static final long serialVersionUID = 1L;
        private final String url, user, password, batchId, copy;
        private final int attempt, loadRows;
        private final Encoder encoder;

        Task(String url, String user, String password, String batchId, int attempt, String copy, Encoder encoder,
             int loadRows) {
            this.url = url;
            this.user = user;
            this.password = password;  // never printed
            this.batchId = batchId;
            this.attempt = attempt;
            this.copy = copy;
            this.encoder = encoder;
            this.loadRows = loadRows;
        }

        @Override
        public Iterator<String> call(Iterator<InternalRow> rows) throws Exception {
            List<String> loads = new ArrayList<>();
            if (!rows.hasNext()) {
                return loads.iterator();
            }
            Properties props = new Properties();
            props.setProperty("user", user);
            props.setProperty("password", password);
            // Two buffers: the next load is read and encoded while the last one COPYs, on a thread of this
            // task's own. The connection is used by one thread at a time: the encoding thread takes a load id
            // only once the COPY before has ended.
            ExecutorService copier = Executors.newSingleThreadExecutor(r -> {
                Thread t = new Thread(r, "tidemark-direct-copy");
                t.setDaemon(true);
                return t;
            });
            try (Connection conn = new org.postgresql.Driver().connect(url, props)) {
                conn.setAutoCommit(false);
                Buffer[] buffers = {new Buffer(), new Buffer()};
                Future<List<String>> pending = null;
                try {
                    long load = nextLoad(conn);
                    for (int k = 0; load >= 0; k++) {
                        // A load is read and encoded first, then COPYed in a transaction of its own: the attempt's
                        // row is held only while its bytes go in, never for as long as the source takes.
                        Buffer buffer = buffers[k % 2];  // the other one's COPY may be under way
                        TreeMap<Integer, long[]> totals = new TreeMap<>();  // rows, high sum, low sum
                        int n = encode(rows, buffer, load, totals);
                        if (pending != null) {
                            Future<List<String>> before = pending;
                            pending = null;
                            loads.addAll(done(before));
                        }
                        long copied = load;
                        load = rows.hasNext() ? nextLoad(conn) : -1;
                        pending = copier.submit(() -> {
                            copy(conn, buffer, n);
                            return lines(copied, totals);
                        });
                    }
                    Future<List<String>> last = pending;
                    pending = null;
                    loads.addAll(done(last));
                } catch (Exception failed) {
                    if (pending != null) {
                        // The COPY under way ends before its connection closes. Its failure came first and is the
                        // only one reported, as without the overlap (not even as suppressed: the extract knows a
                        // refusal by StageRefused's name anywhere in the error, and the next attempt meets the later
                        // one).
                        done(pending);
                    }
                    throw failed;
                }
            } finally {
                copier.shutdownNow();
            }
            return loads.iterator();
        }

        /** Reads and encodes one load of at most loadRows rows and LOAD_BYTES into {@code buffer}; returns its rows. */
        private int encode(Iterator<InternalRow> rows, Buffer buffer, long load, TreeMap<Integer, long[]> totals)
            throws IOException {
            DataOutputStream out = new DataOutputStream(buffer);
            int n = 0;
            buffer.reset();
            out.write(HEADER);
            try {
                while (n < loadRows && buffer.size() < LOAD_BYTES && rows.hasNext()) {
                    InternalRow row = rows.next();
                    n++;
                    int partition = row.getInt(encoder.fields);
                    long hash = row.getLong(encoder.fields + 1);
                    write(out, row, load, partition, hash);
                    long[] t = totals.computeIfAbsent(partition, p -> new long[3]);
                    t[0] += 1;
                    t[1] += hash >> 32;
                    t[2] += hash & 0xFFFFFFFFL;
                }
            } catch (Unencodable exc) {
                throw refused(n, exc);
            }
            out.writeShort(-1);
            return n;
        }

        /** The load's lines, "load partition rows checksum", one per partition. */
        private static List<String> lines(long load, TreeMap<Integer, long[]> totals) {
            List<String> lines = new ArrayList<>();
            for (var e : totals.entrySet()) {
                long[] t = e.getValue();
                BigInteger sum = BigInteger.valueOf(t[1]).shiftLeft(32).add(BigInteger.valueOf(t[2]));
                lines.add(load + " " + e.getKey() + " " + t[0] + " " + sum);
            }
            return lines;
        }

        /**
         * The COPY's lines once it ended, its failure as it was raised. Waits through an interrupt (restored after):
         * the connection must not close while the COPY still writes to it.
         */
        private static List<String> done(Future<List<String>> copy) throws Exception {
            boolean interrupted = false;
            try {
                while (true) {
                    try {
                        return copy.get();
                    } catch (InterruptedException exc) {
                        interrupted = true;
                    } catch (ExecutionException exc) {
                        throw exc.getCause() instanceof Exception cause ? cause : exc;
                    }
                }
            } finally {
                if (interrupted) {
                    Thread.currentThread().interrupt();
                }
            }
        }

        /** COPYs one load's bytes while the ledger shows the attempt open; refuses what the stage's types refuse. */
        private void copy(Connection conn, Buffer buffer, int n) throws SQLException {
            requireOpen(conn);
            CopyIn in = conn.unwrap(PGConnection.class).getCopyAPI().copyIn(copy);
            try {
                buffer.sendTo(in);
                in.endCopy();
                conn.commit();
            } catch (SQLException exc) {
                if (in.isActive()) {
                    try {
                        in.cancelCopy();
                    } catch (SQLException cancel) {
                        exc.addSuppressed(cancel);
                    }
                }
                try {
                    conn.rollback();
                } catch (SQLException rollback) {  // a broken connection: the COPY's own error is what counts
                    exc.addSuppressed(rollback);
                }
                if (!refusal(exc)) {
                    throw exc;  // not the rows' fault (the connection, the server): Spark reports it as it is
                }
                throw refused(n, exc);
            }
        }

        private StageRefused refused(int n, Exception exc) {
            return new StageRefused(REFUSED + " one of " + n + " rows of batch " + batchId + " attempt " + attempt
                                    + ": " + oneLine(exc.getMessage()));
        }

        private long nextLoad(Connection conn) throws SQLException {
            try (Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT nextval('tidemark_control.stage_loads')")) {
                rs.next();
                long load = rs.getLong(1);
                conn.commit();
                return load;
            }
        }

        private void requireOpen(Connection conn) throws SQLException {
            try (PreparedStatement st = conn.prepareStatement(
                "SELECT state FROM tidemark_control.batch_attempts WHERE batch_id = ? AND attempt = ? FOR SHARE")) {
                st.setString(1, batchId);
                st.setInt(2, attempt);
                try (ResultSet rs = st.executeQuery()) {
                    String state = rs.next() ? rs.getString(1) : null;
                    if (!"open".equals(state)) {
                        throw new IllegalStateException("batch " + batchId + " attempt " + attempt + " is "
                                                        + (state == null ? "not in the ledger" : state)
                                                        + ", not open: this task stages nothing more");
                    }
                }
            }
        }

        private void write(DataOutputStream out, InternalRow row, long load, int partition, long hash)
            throws IOException, Unencodable {
            out.writeShort(encoder.fields + 4);  // the fields, the load, partition, offset (none: direct) and hash
            encoder.write(out, row);
            out.writeInt(8);
            out.writeLong(load);
            out.writeInt(4);
            out.writeInt(partition);
            out.writeInt(-1);
            out.writeInt(8);
            out.writeLong(hash);
        }
    }

    /** Writes a row's first {@code fields} columns, each in its stage column's binary form. */
    static final class Encoder implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        final int fields;
        private final Kind[] kinds;
        private final String[] sqlTypes;
        private final int[] precisions, scales;

        Encoder(StructType schema, String[] sqlTypes, int fields) {
            this.fields = fields;
            this.kinds = new Kind[fields];
            this.sqlTypes = java.util.Arrays.copyOf(sqlTypes, fields);
            this.precisions = new int[fields];
            this.scales = new int[fields];
            for (int i = 0; i < fields; i++) {
                DataType t = schema.fields()[i].dataType();
                kinds[i] = kind(t, sqlTypes[i]);
                if (t instanceof DecimalType d) {
                    precisions[i] = d.precision();
                    scales[i] = d.scale();
                }
            }
        }

        void write(DataOutputStream out, InternalRow row) throws IOException, Unencodable {
            for (int i = 0; i < fields; i++) {
                if (row.isNullAt(i)) {
                    out.writeInt(-1);
                } else {
                    value(out, row, i);
                }
            }
        }

        private void value(DataOutputStream out, InternalRow row, int i) throws IOException, Unencodable {
            switch (kinds[i]) {
                case BIGINT -> fixed8(out, row.getLong(i));
                case INTEGER -> fixed4(out, row.getInt(i));
                case SMALLINT -> fixed2(out, (short) inRange(row.getInt(i), Short.MIN_VALUE, Short.MAX_VALUE, i));
                case BOOLEAN -> {
                    out.writeInt(1);
                    out.writeByte(row.getBoolean(i) ? 1 : 0);
                }
                case REAL -> fixed4(out, Float.floatToRawIntBits(row.getFloat(i)));
                case DOUBLE -> fixed8(out, Double.doubleToRawLongBits(row.getDouble(i)));
                case DATE -> {
                    long days = row.getInt(i) - EPOCH_2000_DAYS;
                    if (days < MIN_DATE_DAYS || days > MAX_DATE_DAYS) {
                        throw new Unencodable("column of type date: a value (" + days + " days) is outside PostgreSQL's "
                                              + "range for the type");
                    }
                    fixed4(out, (int) days);
                }
                case TIMESTAMPTZ -> {
                    long micros = row.getLong(i);
                    if (micros < MIN_TIMESTAMP_US + EPOCH_2000_US) {  // the upper end cannot wrap
                        throw new Unencodable("column of type timestamp with time zone: a value (" + micros
                                              + " microseconds) is outside PostgreSQL's range for the type");
                    }
                    fixed8(out, micros - EPOCH_2000_US);
                }
                case NUMERIC -> numeric(out, row.getDecimal(i, precisions[i], scales[i]).toJavaBigDecimal(), scales[i]);
                case UUID -> uuid(out, row.getUTF8String(i).getBytes());
                case JSONB -> {  // its binary form: a version byte, then the text
                    byte[] text = row.getUTF8String(i).getBytes();
                    out.writeInt(text.length + 1);
                    out.writeByte(1);
                    out.write(text);
                }
                case TEXT -> {
                    byte[] text = row.getUTF8String(i).getBytes();
                    out.writeInt(text.length);
                    out.write(text);
                }
            }
        }

        private long inRange(long v, long lo, long hi, int i) throws Unencodable {
            if (v < lo || v > hi) {
                throw new Unencodable("column of type " + sqlTypes[i] + ": value " + v + " out of range [" + lo + ", "
                                      + hi + "]");
            }
            return v;
        }
    }

    private static void fixed2(DataOutputStream out, short v) throws IOException {
        out.writeInt(2);
        out.writeShort(v);
    }

    private static void fixed4(DataOutputStream out, int v) throws IOException {
        out.writeInt(4);
        out.writeInt(v);
    }

    private static void fixed8(DataOutputStream out, long v) throws IOException {
        out.writeInt(8);
        out.writeLong(v);
    }

    private static final long[] POW10 = new long[19];

    static {
        POW10[0] = 1;
        for (int i = 1; i < POW10.length; i++) {
            POW10[i] = POW10[i - 1] * 10;
        }
    }

    /**
     * numeric in PostgreSQL's binary form: ndigits, weight, sign, dscale, then base-10000 digits
     * aligned on the decimal point, without leading or trailing zero digits (the server checks the
     * column's precision and scale as it reads it).
     */
    static void numeric(DataOutputStream out, BigDecimal value, int scale) throws IOException {
        BigInteger unscaled = value.setScale(scale).unscaledValue();
        int fractionGroups = (scale + 3) / 4;
        short[] groups;
        int integerGroups;
        if (unscaled.bitLength() < 63 && scale <= 14) {  // most amounts: in a long, no text
            long abs = Math.abs(unscaled.longValue());
            long integer = abs / POW10[scale], fraction = abs % POW10[scale] * POW10[4 * fractionGroups - scale];
            short[] integerPart = new short[5];  // a long has at most 19 digits
            integerGroups = 0;
            for (; integer > 0; integer /= 10_000) {
                integerPart[integerGroups++] = (short) (integer % 10_000);
            }
            groups = new short[integerGroups + fractionGroups];
            for (int g = 0; g < integerGroups; g++) {
                groups[g] = integerPart[integerGroups - 1 - g];
            }
            for (int g = groups.length - 1; g >= integerGroups; g--, fraction /= 10_000) {
                groups[g] = (short) (fraction % 10_000);
            }
        } else {
            String digits = unscaled.abs().toString();
            if (digits.length() <= scale) {  // at least one integer digit: 0.05 is "0" and "05"
                digits = "0".repeat(scale + 1 - digits.length()) + digits;
            }
            String integer = digits.substring(0, digits.length() - scale);
            String padded = "0".repeat((4 - integer.length() % 4) % 4) + integer + digits.substring(integer.length())
                            + "0".repeat(4 * fractionGroups - scale);
            groups = new short[padded.length() / 4];
            for (int g = 0; g < groups.length; g++) {
                groups[g] = Short.parseShort(padded.substring(4 * g, 4 * g + 4));
            }
            integerGroups = groups.length - fractionGroups;
        }
        int weight = integerGroups - 1;
        int first = 0, last = groups.length;
        while (first < last && groups[first] == 0) {
            first++;
            weight--;
        }
        while (last > first && groups[last - 1] == 0) {
            last--;
        }
        int n = last - first;
        out.writeInt(8 + 2 * n);
        out.writeShort(n);
        out.writeShort(n == 0 ? 0 : weight);
        out.writeShort(unscaled.signum() < 0 ? 0x4000 : 0);
        out.writeShort(scale);
        for (int g = first; g < last; g++) {
            out.writeShort(groups[g]);
        }
    }

    /** uuid as its 16 bytes, from the canonical text only (8-4-4-4-12 hex digits). */
    static void uuid(DataOutputStream out, byte[] text) throws IOException, Unencodable {
        long[] halves = new long[2];
        int nibbles = 0;
        boolean ok = text.length == 36;
        for (int at = 0; ok && at < 36; at++) {
            int c = text[at];
            if (at == 8 || at == 13 || at == 18 || at == 23) {
                ok = c == '-';
                continue;
            }
            int v = Character.digit(c, 16);
            ok = v >= 0 && c < 128;
            halves[nibbles / 16] = (halves[nibbles / 16] << 4) | Math.max(v, 0);
            nibbles++;
        }
        if (!ok) {
            throw new Unencodable("column of type uuid: '" + new String(text, java.nio.charset.StandardCharsets.UTF_8)
                                  + "' is not a uuid in canonical form");
        }
        out.writeInt(16);
        out.writeLong(halves[0]);
        out.writeLong(halves[1]);
    }

    /** A refusal of the rows themselves: a data exception (class 22) or an integrity violation (23). */
    private static boolean refusal(SQLException exc) {
        String state = exc.getSQLState();
        return state != null && (state.startsWith("22") || state.startsWith("23"))
            && !state.equals("22P03") && !state.equals("22P04");  // a malformed COPY stream: this writer's fault
    }

    private static String oneLine(String message) {
        String s = message == null ? "" : String.join(" ", message.trim().split("\\s+"));
        return s.length() > 500 ? s.substring(0, 500) : s;
    }
}
