package io.sluicegate.example;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.DecoderFactory;

/**
 * Checks docs/wire-format/golden.json with Apache Avro for Java and the schema files in the
 * jar: each frame decodes to its value, each value encodes to its frame, each fingerprint is
 * Avro's, and the sealed payload opens. Prints one line per problem and exits 1 if any.
 */
final class GoldenCheck {
    private GoldenCheck() {
    }

    static int run(Path golden) throws IOException {
        JsonNode doc = new ObjectMapper().readTree(Files.readString(golden, StandardCharsets.UTF_8));
        Schemas schemas = Schemas.load();
        Frames frames = new Frames();
        List<String> problems = new ArrayList<>();
        int checked = 0;
        for (JsonNode example : doc.get("records")) {
            String type = example.get("type").asText();
            Schema schema = schemas.get(type);
            byte[] frame = HexFormat.of().parseHex(example.get("frame").asText());
            String fingerprint = Frames.fingerprintHex(schema);
            if (!fingerprint.equals(example.get("fingerprint").asText())) {
                problems.add(type + ": Avro's fingerprint is " + fingerprint);
            }
            GenericRecord value = new GenericDatumReader<GenericRecord>(schema).read(null,
                DecoderFactory.get().jsonDecoder(schema, example.get("value").toString()));
            try {
                GenericRecord decoded = frames.decode(schema, frame);
                if (!decoded.equals(value)) {
                    problems.add(type + ": the frame decodes to " + decoded + ", not " + value);
                }
            } catch (Frames.FrameException e) {
                problems.add(type + ": " + e.getMessage());
            }
            String encoded = HexFormat.of().formatHex(frames.encode(value));
            if (!encoded.equals(example.get("frame").asText())) {
                problems.add(type + ": the value encodes to " + encoded);
            }
            checked++;
        }
        JsonNode sealed = doc.get("sealed_payload");
        byte[] opened = new Sealed(sealed.get("encryption_keys").asText())
            .open(sealed.get("sealed").asText().getBytes(StandardCharsets.US_ASCII));
        if (!new String(opened, StandardCharsets.UTF_8).equals(sealed.get("opened").asText())) {
            problems.add("the sealed payload opens to " + new String(opened, StandardCharsets.UTF_8));
        }
        problems.forEach(System.out::println);
        System.out.println("golden: " + checked + " records and the sealed payload checked, "
            + problems.size() + " problems");
        return problems.isEmpty() ? 0 : 1;
    }
}
