package io.sluicegate.example;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.avro.message.MissingSchemaException;

/**
 * Record values as sluicegate frames them (docs/wire-format.md, Values). Without a schema
 * registry: Avro single-object encoding, C3 01 + the writer schema's CRC-64-AVRO fingerprint
 * (8 bytes, little-endian) + the Avro binary body, which Apache Avro's
 * BinaryMessageEncoder/Decoder are. With one: 00 + the schema id (4 bytes, big-endian) + the
 * body. Either framing is read; records are written in the deployment's.
 */
public final class Frames {
    static final byte MARKER_0 = (byte) 0xC3;
    static final byte MARKER_1 = (byte) 0x01;

    private final Map<Schema, BinaryMessageEncoder<GenericRecord>> encoders = new ConcurrentHashMap<>();
    private final Map<Schema, BinaryMessageDecoder<GenericRecord>> decoders = new ConcurrentHashMap<>();
    private final Registry registry;

    /** Frames for a deployment without a registry (`registry` null) or with one. */
    Frames(Registry registry) {
        this.registry = registry;
    }

    public Frames() {
        this(null);
    }

    public byte[] encode(GenericRecord record) {
        if (registry != null) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            out.write(0);
            out.writeBytes(ByteBuffer.allocate(4).putInt(registry.idOf(record.getSchema())).array());
            BinaryEncoder body = EncoderFactory.get().directBinaryEncoder(out, null);
            try {
                new GenericDatumWriter<GenericRecord>(record.getSchema()).write(record, body);
                body.flush();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            return out.toByteArray();
        }
        BinaryMessageEncoder<GenericRecord> encoder = encoders.computeIfAbsent(
            record.getSchema(), s -> new BinaryMessageEncoder<>(GenericData.get(), s));
        try {
            ByteBuffer buffer = encoder.encode(record);
            byte[] out = new byte[buffer.remaining()];
            buffer.get(out);
            return out;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** The record of type `expected` in `value`; refuses anything else, saying why. */
    public GenericRecord decode(Schema expected, byte[] value) {
        if (value == null) {
            throw new FrameException("expected " + expected.getFullName() + ", found no value (a tombstone)");
        }
        if (value.length >= 5 && value[0] == 0x00) {
            return decodeRegistryFrame(expected, value);
        }
        if (value.length < 10 || value[0] != MARKER_0 || value[1] != MARKER_1) {
            throw new FrameException("expected " + expected.getFullName()
                + " in single-object encoding (C3 01 ...), found " + hex(value, 10));
        }
        BinaryMessageDecoder<GenericRecord> decoder = decoders.computeIfAbsent(
            expected, s -> new BinaryMessageDecoder<>(GenericData.get(), s));
        try {
            return decoder.decode(value);
        } catch (MissingSchemaException e) {
            throw new FrameException("expected " + expected.getFullName() + " (fingerprint "
                + fingerprintHex(expected) + "), found fingerprint " + hex(value, 10).substring(4)
                + ": another record type, or a release this engine does not know");
        } catch (IOException | RuntimeException e) {
            throw new FrameException("expected " + expected.getFullName() + ": the body does not decode: " + e);
        }
    }

    private GenericRecord decodeRegistryFrame(Schema expected, byte[] value) {
        int id = ByteBuffer.wrap(value, 1, 4).getInt();
        if (registry == null) {
            throw new FrameException("a schema registry frame (00 + schema id " + id + "), and no"
                + " SLUICEGATE_SCHEMA_REGISTRY_URL to look the id up in");
        }
        Schema writer = registry.writerSchema(id);
        if (!writer.getFullName().equals(expected.getFullName())) {
            throw new FrameException("expected " + expected.getFullName() + ", found schema id " + id
                + " of " + writer.getFullName());
        }
        try {
            // Avro schema resolution: the writer's version read into the schema this engine knows.
            return new GenericDatumReader<GenericRecord>(writer, expected, GenericData.get())
                .read(null, DecoderFactory.get().binaryDecoder(value, 5, value.length - 5, null));
        } catch (IOException | RuntimeException e) {
            throw new FrameException("expected " + expected.getFullName() + ": the body does not decode: " + e);
        }
    }

    /** The 8 fingerprint bytes a frame of this schema carries, as hex. */
    public static String fingerprintHex(Schema schema) {
        long fingerprint = SchemaNormalization.parsingFingerprint64(schema);
        byte[] bytes = new byte[8];
        for (int i = 0; i < 8; i++) {
            bytes[i] = (byte) (fingerprint >>> (8 * i));
        }
        return HexFormat.of().formatHex(bytes);
    }

    static String hex(byte[] value, int max) {
        return HexFormat.of().formatHex(value, 0, Math.min(max, value.length));
    }

    public static final class FrameException extends RuntimeException {
        FrameException(String message) {
            super(message);
        }
    }
}
